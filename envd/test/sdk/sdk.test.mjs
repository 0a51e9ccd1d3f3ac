// The e2b JS SDK, unmodified, against a real Skiff envd: the SDK runs in
// debug mode (no API) with sandboxUrl pointing at an envd this file starts on
// a free loopback port. The sandbox object carries an access token and
// Skiff's advertised envd version, as one made through the API would, so the
// SDK's version gates and signed URLs behave as they do in production.
//
// As root, envd runs in a mount namespace of its own (unshare --mount
// --propagation slave) with an empty tmpfs on /root and /home: the SDK's
// commands run through `bash -l`, which would source the machine's
// /root/.profile and .bashrc (CI's printed pyenv errors to every command's
// stderr), and what the suite writes under root's home stays off the host.
//
//   ENVD_BIN      the envd binary (required)
//   E2B_PACKAGE   which SDK to load: "e2b" (2.51.0, default) or "e2b-2.50.0"
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { createServer } from 'node:net'
import { randomBytes, createHash } from 'node:crypto'
import { copyFileSync, mkdtempSync, realpathSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const pkg = process.env.E2B_PACKAGE || 'e2b'
const { Sandbox, CommandExitError, TimeoutError, NotFoundError, FilesystemEventType } = await import(pkg)
const envdBin = process.env.ENVD_BIN
if (!envdBin) throw new Error('set ENVD_BIN to the envd binary')
const version = execFileSync(envdBin, ['--version']).toString().trim()

let envd, url, sbx, work, binDir
let envdLog = ''
const token = randomBytes(16).toString('hex')

// The folders hidden behind an empty tmpfs when envd runs as root, and the
// script that mounts them inside envd's new mount namespace, then runs envd
// (unshare runs it in place: envd keeps the pid spawn gave it).
const homes = ['/root', '/home']
const hideHomes = `set -e
for d in ${homes.join(' ')}; do
  if [ -d "$d" ]; then
    mode=0755; [ "$d" = /root ] && mode=0700
    mount -t tmpfs -o "mode=$mode,size=64m,nosuid,nodev" envd-sdk-test "$d"
  fi
done
exec "$@"`

// spawnEnvd starts envd with args: as root, where the homes are empty (an
// envd binary under one is copied out first, or the tmpfs would hide it);
// otherwise as it is, in the host's mount namespace.
function spawnEnvd(args, opts) {
  if (process.getuid() !== 0) return spawn(envdBin, args, opts)
  let bin = realpathSync(envdBin)
  if (homes.some((h) => bin.startsWith(`${h}/`))) {
    binDir = mkdtempSync(join(tmpdir(), 'envd-sdk-bin-'))
    copyFileSync(bin, join(binDir, 'envd'))
    bin = join(binDir, 'envd')
  }
  return spawn('unshare', ['--mount', '--propagation', 'slave', '--', '/bin/sh', '-c', hideHomes, 'sh', bin, ...args], opts)
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer()
    srv.on('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

before(async () => {
  const port = await freePort()
  url = `http://127.0.0.1:${port}`
  // --init: as in a sandbox, where envd is PID 1 (here a child subreaper),
  // reaps orphans and logs process output. Its log (stdout) is kept for the
  // last test.
  envd = spawnEnvd(['--listen-address', '127.0.0.1', '--port', String(port), '--init'], { stdio: ['ignore', 'pipe', 'inherit'] })
  envd.stdout.setEncoding('utf8')
  envd.stdout.on('data', (d) => { envdLog += d })
  const deadline = Date.now() + 10_000
  for (;;) {
    try {
      const res = await fetch(`${url}/health`)
      if (res.status === 204) break
    } catch {}
    if (Date.now() > deadline) throw new Error('envd did not answer /health within 10s')
    await new Promise((r) => setTimeout(r, 20))
  }
  // What sandboxd does when it starts a sandbox.
  const init = await fetch(`${url}/init`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ accessToken: token, envVars: { SKIFF_TEST: 'yes' } }),
  })
  assert.equal(init.status, 204)
  assert.equal(init.headers.get('x-envd-version'), version)
  sbx = new Sandbox({ sandboxId: 'debug_sandbox_id', envdVersion: version, envdAccessToken: token, sandboxUrl: url, debug: true })
  work = mkdtempSync(join(tmpdir(), 'envd-sdk-'))
})

after(() => {
  envd?.kill('SIGTERM')
  if (work) rmSync(work, { recursive: true, force: true })
  if (binDir) rmSync(binDir, { recursive: true, force: true })
})

// As root, commands see an empty tmpfs for root's home, not the machine's:
// no dotfile of the host's changes what they print.
test(`${pkg}: root's home is an empty tmpfs of envd's own`, { skip: process.getuid() !== 0 && 'envd runs as it is when not root' }, async () => {
  const r = await sbx.commands.run('stat -f -c %T /root; stat -c %d /root; ls -A /root | wc -l')
  const [fstype, dev, entries] = r.stdout.trim().split('\n')
  assert.equal(fstype, 'tmpfs')
  assert.notEqual(Number(dev), statSync('/root').dev, "envd's /root is the host's")
  assert.equal(entries.trim(), '0')
  assert.equal(r.stderr, '')
})

test(`${pkg}: run returns stdout, and the exit code of a failure`, async () => {
  const ok = await sbx.commands.run('echo hello')
  assert.equal(ok.exitCode, 0)
  assert.equal(ok.stdout, 'hello\n')
  await assert.rejects(sbx.commands.run('echo out; echo err >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'out\n')
    assert.equal(err.stderr, 'err\n')
    return true
  })
})

test(`${pkg}: run with env, cwd, user and streaming callbacks`, async () => {
  let streamed = ''
  const r = await sbx.commands.run('echo "$FOO $SKIFF_TEST $E2B_SANDBOX"; pwd; id -un', {
    envs: { FOO: 'bar' },
    cwd: '/tmp',
    user: 'root',
    onStdout: (d) => { streamed += d },
  })
  assert.equal(r.stdout, 'bar yes true\n/tmp\nroot\n')
  assert.equal(streamed, r.stdout)
  const nobody = await sbx.commands.run('id -un', { user: 'nobody' })
  assert.equal(nobody.stdout, 'nobody\n')
})

// Commands that get killed run as nobody: the SDK starts a login shell, and
// killing root's in the middle of its profile can leave the host's locks
// behind (pyenv's rehash lock, on these machines).
test(`${pkg}: a timeout ends the command`, async () => {
  await assert.rejects(sbx.commands.run('sleep 10', { timeoutMs: 500, user: 'nobody' }), (err) => err instanceof TimeoutError)
  // The timeout is the command's lifetime: envd kills it.
  const deadline = Date.now() + 5_000
  while ((await sbx.commands.list()).some((p) => p.args?.includes('sleep 10'))) {
    assert.ok(Date.now() < deadline, 'the timed-out command still runs 5s later')
    await new Promise((r) => setTimeout(r, 20))
  }
})

test(`${pkg}: background command with stdin, list, reconnect and kill`, async () => {
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  assert.ok(h.pid > 0)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), 'list shows the background command')
  await h.disconnect()

  let seen = ''
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => { seen += d } })
  await sbx.commands.sendStdin(h.pid, 'ping\n')
  await sbx.commands.closeStdin(h.pid)
  const res = await again.wait()
  assert.equal(res.exitCode, 0)
  assert.equal(seen, 'ping\n')

  const sleeper = await sbx.commands.run('sleep 30', { background: true, user: 'nobody' })
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  await assert.rejects(sleeper.wait(), (err) => err instanceof CommandExitError && err.exitCode === -1)
  assert.equal(await sbx.commands.kill(999999), false)
})

test(`${pkg}: pty create, resize and input`, async () => {
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo $((6*7)); exit\n'))
  await term.wait()
  assert.match(out, /40 120/)
  assert.match(out, /42/)
})

test(`${pkg}: files write and read text, bytes and 50 MB`, async () => {
  const p = join(work, 'hello.txt')
  const info = await sbx.files.write(p, 'hello world')
  assert.equal(info.path, p)
  assert.equal(await sbx.files.read(p), 'hello world')
  const bytes = new Uint8Array([0, 1, 2, 250, 255])
  await sbx.files.write(join(work, 'bin'), bytes)
  assert.deepEqual(new Uint8Array(await sbx.files.read(join(work, 'bin'), { format: 'bytes' })), bytes)

  const big = randomBytes(50 << 20)
  await sbx.files.write(join(work, 'big'), big)
  const back = await sbx.files.read(join(work, 'big'), { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.equal(createHash('sha256').update(back).digest('hex'), createHash('sha256').update(big).digest('hex'))

  // Several files in one call, one of them relative to the user's home.
  const rel = `envd-sdk-${randomBytes(4).toString('hex')}/rel.txt`
  const many = await sbx.files.write([{ path: join(work, 'a.txt'), data: 'A' }, { path: rel, data: 'R' }])
  assert.equal(many.length, 2)
  assert.equal(await sbx.files.read(`/root/${rel}`), 'R')
  await sbx.files.remove(`/root/${rel.split('/')[0]}`)
})

test(`${pkg}: files gzip both ways and metadata`, async () => {
  const p = join(work, 'gz.txt')
  await sbx.files.write(p, 'x'.repeat(10_000), { gzip: true, metadata: { owner: 'skiff', purpose: 'test' } })
  assert.equal(await sbx.files.read(p, { gzip: true }), 'x'.repeat(10_000))
  const info = await sbx.files.getInfo(p)
  assert.deepEqual(info.metadata, { owner: 'skiff', purpose: 'test' })
})

test(`${pkg}: files list with depth, exists, getInfo, makeDir, rename, remove`, async () => {
  const d = join(work, 'tree')
  assert.equal(await sbx.files.makeDir(join(d, 'sub', 'deeper')), true)
  assert.equal(await sbx.files.makeDir(d), false)
  await sbx.files.write(join(d, 'sub', 'f.txt'), 'f')
  const one = await sbx.files.list(d)
  assert.deepEqual(one.map((e) => e.name), ['sub'])
  const two = await sbx.files.list(d, { depth: 3 })
  assert.deepEqual(two.map((e) => e.path).sort(), [join(d, 'sub'), join(d, 'sub', 'deeper'), join(d, 'sub', 'f.txt')])
  const info = await sbx.files.getInfo(join(d, 'sub', 'f.txt'))
  assert.equal(info.type, 'file')
  assert.equal(info.size, 1)
  assert.equal(info.owner, 'root')
  assert.match(info.permissions, /^-rw/)
  assert.equal(await sbx.files.exists(join(d, 'nope')), false)
  await sbx.files.rename(join(d, 'sub', 'f.txt'), join(d, 'g.txt'))
  assert.equal(await sbx.files.exists(join(d, 'g.txt')), true)
  await sbx.files.remove(d)
  assert.equal(await sbx.files.exists(d), false)
  await sbx.files.remove(d) // like rm -rf: a missing path is fine
  await assert.rejects(sbx.files.read(join(d, 'g.txt')), (err) => err instanceof NotFoundError)
})

test(`${pkg}: signed upload and download URLs`, async () => {
  const p = join(work, 'signed.txt')
  const up = await sbx.uploadUrl(p, { useSignatureExpiration: 60 })
  const form = new FormData()
  form.append('file', new Blob(['via signed url']), p)
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  const down = await sbx.downloadUrl(p, { useSignatureExpiration: 60 })
  const got = await fetch(down)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'via signed url')
  const tampered = new URL(down)
  tampered.searchParams.set('path', join(work, 'hello.txt'))
  assert.equal((await fetch(tampered)).status, 401)
})

test(`${pkg}: watchDir recursive with includeEntry`, async () => {
  const d = join(work, 'watched')
  await sbx.files.makeDir(join(d, 'inner'))
  const events = []
  const handle = await sbx.files.watchDir(d, (e) => events.push(e), { recursive: true, includeEntry: true })
  await sbx.files.write(join(d, 'inner', 'w.txt'), 'data')
  const deadline = Date.now() + 5_000
  while (!events.some((e) => e.name === 'inner/w.txt' && e.type === FilesystemEventType.WRITE)) {
    assert.ok(Date.now() < deadline, `no write event for inner/w.txt in 5s: ${JSON.stringify(events)}`)
    await new Promise((r) => setTimeout(r, 20))
  }
  const withEntry = events.find((e) => e.name === 'inner/w.txt' && e.entry)
  assert.ok(withEntry, 'events carry their entry')
  assert.equal(withEntry.entry.path, join(d, 'inner', 'w.txt'))
  await handle.stop()
})

// Last: envd's log is JSON lines for sandboxd, with each command's start,
// exit and output, and never the access token, an environment value or a
// file's contents.
// As a user other than root, files calls act as e2b's envd does, as root:
// the user may write into root's directories (e2b's own SDK tests write
// /0/file as the default user) and read root's 0600 file; what is created,
// and a file written, is the user's.
test(`${pkg}: files as a user act as root and give the user what they write`, { skip: process.getuid() !== 0 && 'needs envd running as root' }, async () => {
  const home = join(work, 'nobody-home')
  const secret = join(work, 'secret')
  await sbx.commands.run(`chmod 755 ${work} && mkdir ${home} && chown nobody ${home} && printf secret > ${secret} && chmod 600 ${secret}`)
  assert.equal(await sbx.files.read(secret, { user: 'nobody' }), 'secret')
  const rootsDir = join(work, 'roots', 'new')
  await sbx.files.write(join(rootsDir, 'mine.txt'), 'mine', { user: 'nobody' })
  assert.equal((await sbx.files.getInfo(join(rootsDir, 'mine.txt'))).owner, 'nobody')
  assert.equal((await sbx.files.getInfo(rootsDir)).owner, 'nobody')
  await sbx.files.makeDir(join(work, 'made', 'deeper'), { user: 'nobody' })
  assert.equal((await sbx.files.getInfo(join(work, 'made'))).owner, 'nobody')
  await sbx.files.write(secret, 'overwritten', { user: 'nobody' })
  const after = await sbx.commands.run(`stat -c '%U %a' ${secret} && cat ${secret}`)
  assert.equal(after.stdout, 'nobody 600\noverwritten')
  await sbx.files.remove(secret, { user: 'nobody' })
  assert.equal(await sbx.files.exists(secret), false)
})

test(`${pkg}: envd's log has commands and output but no secrets`, async () => {
  const envSecret = `env-${randomBytes(8).toString('hex')}`
  const fileSecret = `file-${randomBytes(8).toString('hex')}`
  await sbx.files.write(join(work, 'secret.txt'), fileSecret)
  assert.equal(await sbx.files.read(join(work, 'secret.txt')), fileSecret)
  const h = await sbx.commands.run('test -n "$LOG_SECRET" && echo log-marker', { envs: { LOG_SECRET: envSecret }, background: true })
  const r = await h.wait()
  assert.equal(r.stdout, 'log-marker\n')
  const deadline = Date.now() + 5_000
  let lines
  for (;;) {
    const whole = envdLog.slice(0, envdLog.lastIndexOf('\n')) // lines still being written wait
    lines = whole.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l))
    if (lines.some((l) => l.line === 'process exited' && l.pid === h.pid)) break
    assert.ok(Date.now() < deadline, 'no exit line for the command')
    await new Promise((res) => setTimeout(res, 20))
  }
  for (const l of lines) {
    assert.ok(['envd', 'stdout', 'stderr'].includes(l.source), JSON.stringify(l))
    assert.ok(!Number.isNaN(Date.parse(l.time)) && l.time.endsWith('Z'), JSON.stringify(l))
    assert.equal(typeof l.line, 'string')
  }
  for (const secret of [token, envSecret, fileSecret]) assert.ok(!envdLog.includes(secret), `the log holds ${secret}`)
  assert.ok(lines.some((l) => l.line === 'init' && l.access_token === 'set'))
  assert.ok(lines.some((l) => l.line === 'process started' && l.pid === h.pid && l.cmd === '/bin/bash'))
  assert.ok(lines.some((l) => l.source === 'stdout' && l.pid === h.pid && l.line === 'log-marker'))
})

// The e2b JS SDK, unmodified, against the whole Skiff system as `make up`
// runs it: the e2b API (sandbox-apiserver), the envd proxy, sandboxd and real
// sandboxes of the base template. sdk_test.go starts the system and runs
// this file once per SDK version.
//
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   the system, as `make up` prints it
//   SKIFF_API_KEY_B                             a key of a second team
//   E2B_PACKAGE                                 "e2b" (2.51.0), "e2b-2.50.0", "e2b-2.45.0" or "e2b-2.13.1"
//   SKIFF_RUNTIME                               sandboxd's runtime: "native" (the default) or "gvisor"
//   E2B_VOLUME_API_URL                          where the SDK's Volume reaches volume content (E2B_API_URL)
//   SKIFF_WEB1, SKIFF_WEB2                      two web servers sandboxes may reach (shared/testing/egresstest:
//                                               HTTP on 80, TLS on 443, allowed.test and *.wild.test resolving
//                                               to the first, other.test to the second); without them the
//                                               outbound-rules cases are skipped
//
// In domain mode (make up --domain) E2B_DOMAIN replaces E2B_API_URL and
// E2B_SANDBOX_URL, and NODE_EXTRA_CA_CERTS names the local CA.
import { test, afterEach } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import http from 'node:http'
import { promisify } from 'node:util'

const pkg = process.env.E2B_PACKAGE || 'e2b'
const { Sandbox, CommandExitError, ALL_TRAFFIC = '0.0.0.0/0', Volume, VolumeNotFoundError, VolumePathNotFoundError } = await import(pkg)
// Domain mode: the SDK names everything under E2B_DOMAIN, over TLS.
const domainMode = !process.env.E2B_SANDBOX_URL
// Without E2B_VOLUME_API_URL the SDK's Volume would call https://api.e2b.app.
for (const v of domainMode ? ['E2B_DOMAIN', 'E2B_API_KEY', 'SKIFF_API_KEY_B'] : ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY', 'SKIFF_API_KEY_B']) {
  if (!process.env[v]) throw new Error(`set ${v}`)
}
// 2.13.x is here for one thing: its /files calls carry no routing headers.
const legacy = pkg === 'e2b-2.13.1'
const runtime = process.env.SKIFF_RUNTIME || 'native'
const keyB = process.env.SKIFF_API_KEY_B
const run = randomBytes(4).toString('hex') // tells this run's sandboxes apart

const made = []
async function create(opts = {}) {
  const sbx = await Sandbox.create('base', { timeoutMs: 300_000, ...opts, metadata: { run, ...(opts.metadata ?? {}) } })
  made.push(sbx.sandboxId)
  return sbx
}

// Each test's sandboxes go when it ends, passed or failed.
afterEach(async () => {
  for (const id of made.splice(0)) await Sandbox.kill(id).catch(() => {})
})

test(`${pkg}: create, run as user in /home/user with env vars`, async () => {
  const sbx = await create({ envs: { FROM_CREATE: 'c1' } })
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
  const res = await sbx.commands.run('echo "$(whoami) $PWD $FROM_CREATE $FROM_RUN"', { envs: { FROM_RUN: 'r1' } })
  assert.equal(res.exitCode, 0)
  assert.equal(res.stdout, 'user /home/user c1 r1\n')
  await assert.rejects(sbx.commands.run('exit 7'), (err) => err instanceof CommandExitError && err.exitCode === 7)
  // The base template has python3 (also as python) and pip, and the sandbox its own hostname space.
  const py = await sbx.commands.run('python3 -c "print(6*7)" && python -c "print(7*7)" && pip --version >/dev/null && echo pip')
  assert.equal(py.stdout, '42\n49\npip\n')
  // user has sudo, without a password, as in e2b's template.
  assert.equal((await sbx.commands.run('sudo -n whoami')).stdout, 'root\n')
})

test(`${pkg}: files write, read and list`, async () => {
  const sbx = await create()
  // Header-less /files (2.13.x) is routed by the access token.
  await sbx.files.write('/home/user/notes.txt', 'hello world\n')
  assert.equal(await sbx.files.read('/home/user/notes.txt'), 'hello world\n')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('notes.txt'), names.join(','))
  const res = await sbx.commands.run('cat /home/user/notes.txt && stat -c %U /home/user/notes.txt')
  assert.equal(res.stdout, 'hello world\nuser\n')
})

test(`${pkg}: kill returns true, then false`, async () => {
  const sbx = await create()
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  // The proxy answers e2b's 502 for it: the SDK's "sandbox not found".
  await assert.rejects(sbx.commands.run('true'))
})

test(`${pkg}: list with a metadata filter and pagination; another team sees none of it`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const tag = randomBytes(4).toString('hex')
  const ids = []
  for (let i = 0; i < 3; i++) ids.push((await create({ metadata: { tag, 'with space': 'a b&c=d' } })).sandboxId)
  const pager = Sandbox.list({ query: { metadata: { tag, 'with space': 'a b&c=d' } }, limit: 2 })
  const first = await pager.nextItems()
  assert.equal(first.length, 2)
  assert.equal(pager.hasNext, true)
  const second = await pager.nextItems()
  assert.equal(second.length, 1)
  assert.equal(pager.hasNext, false)
  const seen = [...first, ...second].map((s) => s.sandboxId).sort()
  assert.deepEqual(seen, [...ids].sort())
  for (const s of [...first, ...second]) {
    assert.equal(s.templateId, 'base')
    assert.equal(s.state, 'running')
    assert.equal(s.metadata.tag, tag)
    assert.equal(s.metadata['with space'], 'a b&c=d')
    // What the list says is what getInfo says.
    const info = await Sandbox.getInfo(s.sandboxId)
    for (const k of ['templateId', 'state', 'cpuCount', 'memoryMB', 'envdVersion']) {
      assert.equal(s[k], info[k], `list and getInfo disagree on ${k}`)
    }
    assert.ok(s.envdVersion, 'the list gives no envdVersion')
    assert.equal(s.startedAt.getTime(), info.startedAt.getTime())
    assert.equal(s.endAt.getTime(), info.endAt.getTime())
    assert.deepEqual(s.metadata, info.metadata)
  }
  // Team B: its list holds none of them, and the IDs are not found.
  const other = Sandbox.list({ apiKey: keyB, query: { metadata: { tag } } })
  assert.deepEqual(await other.nextItems(), [])
  await assert.rejects(Sandbox.connect(ids[0], { apiKey: keyB }))
  assert.equal(await Sandbox.kill(ids[0], { apiKey: keyB }), false)
})

test(`${pkg}: getInfo and setTimeout`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create({ metadata: { purpose: 'info' } })
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.purpose, 'info')
  assert.ok(info.startedAt instanceof Date && info.endAt > info.startedAt)
  await sbx.setTimeout(900_000)
  const later = await sbx.getInfo()
  const left = later.endAt.getTime() - Date.now()
  assert.ok(left > 800_000 && left <= 900_000, `endAt is ${left} ms away`)
})

test(`${pkg}: connect, pause and resume keep the sandbox's files`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/kept.txt', 'still here')
  assert.equal(await Sandbox.pause(sbx.sandboxId), true)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false) // already paused
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  const again = await Sandbox.connect(sbx.sandboxId) // resumes it
  assert.equal((await again.getInfo()).state, 'running')
  assert.equal(await again.files.read('/home/user/kept.txt'), 'still here')
  const res = await again.commands.run('echo resumed')
  assert.equal(res.stdout, 'resumed\n')
})

test(`${pkg}: metrics`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  let metrics = []
  for (let i = 0; i < 40 && metrics.length === 0; i++) {
    metrics = await sbx.getMetrics()
    if (metrics.length === 0) await new Promise((r) => setTimeout(r, 500))
  }
  assert.ok(metrics.length > 0, 'no metrics within 20 s')
  const m = metrics.at(-1)
  assert.ok(m.cpuCount >= 1, JSON.stringify(m))
  assert.ok(m.memTotal > 0 && m.memUsed > 0, JSON.stringify(m))
})

test(`${pkg}: a command silent for 65 s keeps its stream (keepalives pass the proxy)`, async () => {
  const sbx = await create()
  const out = []
  const res = await sbx.commands.run('echo start; sleep 65; echo done', { timeoutMs: 120_000, onStdout: (d) => out.push(d) })
  assert.equal(res.exitCode, 0)
  assert.equal(res.stdout, 'start\ndone\n')
  assert.ok(out.join('').includes('start'))
})

test(`${pkg}: 100 MB upload and download`, async () => {
  const sbx = await create()
  const data = randomBytes(100 << 20)
  const sum = createHash('sha256').update(data).digest('hex')
  await sbx.files.write('/home/user/big.bin', data)
  const res = await sbx.commands.run('sha256sum /home/user/big.bin')
  assert.equal(res.stdout.split(' ')[0], sum)
  const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
  assert.equal(back.length, data.length)
  assert.equal(createHash('sha256').update(back).digest('hex'), sum)
})

test(`${pkg}: watchDir sees a file appear`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  await sbx.files.makeDir('/home/user/watched')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e))
  try {
    await sbx.files.write('/home/user/watched/new.txt', 'x')
    for (let i = 0; i < 50 && !events.some((e) => e.name === 'new.txt'); i++) await new Promise((r) => setTimeout(r, 100))
    assert.ok(events.some((e) => e.name === 'new.txt'), JSON.stringify(events))
  } finally {
    await handle.stop()
  }
})

test(`${pkg}: a PTY session`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  let out = ''
  const dec = new TextDecoder()
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('echo pty-$((40+2))\nexit\n'))
  const res = await pty.wait()
  assert.equal(res.exitCode, 0)
  assert.ok(out.includes('pty-42'), out)
})

// get sends a request for host through the proxy, as a browser would for
// getHost(port) with wildcard DNS; in domain mode, to the name itself.
async function get(host, headers = {}) {
  if (domainMode) {
    const res = await fetch(`https://${host}/`, { headers })
    return { status: res.status, body: await res.text() }
  }
  const proxy = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: proxy.hostname, port: proxy.port, path: '/', headers: { Host: host, ...headers } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

async function serve(sbx, port) {
  await sbx.commands.run(`mkdir -p /tmp/www && echo served-${port} > /tmp/www/index.html`)
  await sbx.commands.run(`cd /tmp/www && python3 -m http.server ${port}`, { background: true })
  const host = sbx.getHost(port)
  for (let i = 0; i < 100; i++) {
    const res = await get(host, sbx.trafficAccessToken ? { 'e2b-traffic-access-token': sbx.trafficAccessToken } : {})
    if (res.status === 200) return host
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`the server on port ${port} never answered through the proxy`)
}

test(`${pkg}: a user port reached through {port}-{id}.{domain}`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  const host = await serve(sbx, 8080)
  assert.equal(host, `8080-${sbx.sandboxId}.${process.env.E2B_DOMAIN || 'e2b.app'}`)
  const res = await get(host)
  assert.equal(res.status, 200)
  assert.equal(res.body, 'served-8080\n')
})

test(`${pkg}: presigned uploadUrl and downloadUrl, without the SDK (domain mode)`, { skip: (legacy || !domainMode) && 'they name the sandbox by host: domain mode' }, async () => {
  const sbx = await create({ secure: true })
  const up = await sbx.uploadUrl('/home/user/up.txt')
  assert.match(up, new RegExp(`^https://49983-${sbx.sandboxId}\\.`))
  const form = new FormData()
  form.append('file', new Blob(['uploaded without the SDK']), 'up.txt')
  let res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.text())
  res = await fetch(await sbx.downloadUrl('/home/user/up.txt'))
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'uploaded without the SDK')
  assert.equal((await sbx.commands.run('stat -c %U /home/user/up.txt')).stdout, 'user\n')
  // A signature for another path, or past its expiry, opens nothing.
  const other = new URL(await sbx.downloadUrl('/home/user/up.txt'))
  other.searchParams.set('path', '/home/user/.bashrc')
  assert.equal((await fetch(other)).status, 401)
  const expiring = await sbx.downloadUrl('/home/user/up.txt', { useSignatureExpiration: 1 })
  await new Promise((r) => setTimeout(r, 2100))
  res = await fetch(expiring)
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'signature is already expired' })
})

test(`${pkg}: private traffic needs the traffic access token`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create({ network: { allowPublicTraffic: false } })
  assert.ok(sbx.trafficAccessToken, 'no trafficAccessToken')
  const host = await serve(sbx, 8081)
  assert.equal((await get(host)).status, 403)
  assert.equal((await get(host, { 'e2b-traffic-access-token': 'wrong' })).status, 403)
  const ok = await get(host, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
  assert.equal(ok.status, 200)
  assert.equal(ok.body, 'served-8081\n')
  // envd's own port is not behind it.
  assert.equal((await sbx.commands.run('echo envd')).stdout, 'envd\n')
})

test(`${pkg}: a paused sandbox with autoResume wakes on traffic through the proxy`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
  await sbx.files.write('/home/user/before.txt', 'kept')
  assert.equal(await Sandbox.pause(sbx.sandboxId), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  // No connect: the command's request itself resumes the sandbox.
  const res = await sbx.commands.run('cat /home/user/before.txt')
  assert.equal(res.stdout, 'kept')
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.equal(info.lifecycle?.autoResume ?? true, true)
})

// As on e2b, the SDK's isRunning (envd's /health, with the sandbox's token)
// wakes a paused sandbox with autoResume; without autoResume it answers
// false.
test(`${pkg}: isRunning wakes a paused sandbox with autoResume`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
  assert.equal(await Sandbox.pause(sbx.sandboxId), true)
  assert.equal(await sbx.isRunning(), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
})

// Rounds of the calls that once lost a stream about one time in thirty
// (sandboxd's relay cut envd's answer when it started before the request
// body was seen to end): a stream cut in any round fails the test.
test(`${pkg}: 25 rounds of create, commands, write, pause and auto-resume keep every stream whole`, { skip: pkg !== 'e2b' && 'one SDK version is enough' }, async () => {
  for (let i = 0; i < 25; i++) {
    // At most 4 creates a second, under the team's 5: a round here can
    // take less than 200 ms, and the tests after this one create too.
    if (i > 0) await new Promise((r) => setTimeout(r, 250))
    const sbx = await create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
    assert.equal((await sbx.commands.run(`echo round ${i}`)).stdout, `round ${i}\n`)
    await assert.rejects(sbx.commands.run('exit 7'), (err) => err instanceof CommandExitError && err.exitCode === 7)
    await sbx.files.write('/home/user/round.txt', `${i}`)
    assert.equal(await Sandbox.pause(sbx.sandboxId), true)
    assert.equal((await sbx.commands.run('cat /home/user/round.txt')).stdout, `${i}`)
    assert.equal(await Sandbox.kill(sbx.sandboxId), true)
    made.splice(made.indexOf(sbx.sandboxId), 1)
  }
})

// Snapshots and fork, as e2b's own tests (packages/js-sdk/tests/sandbox/
// snapshot-api.test.ts and fork.test.ts) use them.
const snapshots = []
afterEach(async () => {
  for (const id of snapshots.splice(0)) await Sandbox.deleteSnapshot(id).catch(() => {})
})

test(`${pkg}: a snapshot starts sandboxes with its files, each its own copy`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  await sbx.files.makeDir('/home/user/app')
  await sbx.files.write('/home/user/app/config.json', '{"env": "test"}')
  await sbx.files.write('/home/user/shared.txt', 'shared snapshot content')
  const snap = await sbx.createSnapshot()
  snapshots.push(snap.snapshotId)
  assert.match(snap.snapshotId, /^[a-z0-9]{20}:default$/)
  assert.deepEqual(snap.names, [])
  // The source runs on; what it writes now is its own.
  await sbx.files.write('/home/user/shared.txt', 'after the snapshot')
  const one = await Sandbox.create(snap.snapshotId, { metadata: { run } })
  made.push(one.sandboxId)
  const two = await Sandbox.create(snap.snapshotId, { metadata: { run } })
  made.push(two.sandboxId)
  assert.equal(await one.files.exists('/home/user/app'), true)
  assert.equal(await one.files.read('/home/user/app/config.json'), '{"env": "test"}')
  assert.equal(await two.files.read('/home/user/shared.txt'), 'shared snapshot content')
  await one.files.write('/home/user/shared.txt', 'modified in one')
  assert.equal(await one.files.read('/home/user/shared.txt'), 'modified in one')
  assert.equal(await two.files.read('/home/user/shared.txt'), 'shared snapshot content')
  assert.equal(await sbx.files.read('/home/user/shared.txt'), 'after the snapshot')
  // Owned by the sandbox's user, as written.
  assert.equal((await one.commands.run('stat -c %U /home/user/shared.txt')).stdout, 'user\n')
})

test(`${pkg}: named snapshots, lists, filters, delete; another team sees none`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  const name = `snap-${run}`
  const named = await sbx.createSnapshot({ name })
  snapshots.push(named.snapshotId)
  assert.ok(named.names.some((n) => n.includes(name)), named.names.join(','))
  assert.ok(named.snapshotId.endsWith(`/${name}:default`), named.snapshotId)
  const plain = await sbx.createSnapshot()
  snapshots.push(plain.snapshotId)

  const all = Sandbox.listSnapshots()
  assert.equal(all.hasNext, true)
  const listed = (await all.nextItems()).map((s) => s.snapshotId)
  assert.ok(listed.includes(named.snapshotId) && listed.includes(plain.snapshotId), listed.join(','))
  const mine = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId)
  assert.deepEqual(mine.sort(), [named.snapshotId, plain.snapshotId].sort())
  const byName = (await Sandbox.listSnapshots({ name }).nextItems()).map((s) => s.snapshotId)
  assert.deepEqual(byName, [named.snapshotId])
  assert.deepEqual(await Sandbox.listSnapshots({ name: `${name}-does-not-exist` }).nextItems(), [])
  assert.deepEqual(await Sandbox.listSnapshots({ apiKey: keyB }).nextItems(), [])
  // By name: a create from it, and another team's create and delete fail.
  const fromName = await Sandbox.create(named.snapshotId, { metadata: { run } })
  made.push(fromName.sandboxId)
  assert.equal((await fromName.commands.run('whoami')).stdout, 'user\n')
  await assert.rejects(Sandbox.create(plain.snapshotId, { apiKey: keyB }))
  assert.equal(await Sandbox.deleteSnapshot(plain.snapshotId, { apiKey: keyB }), false)

  assert.equal(await Sandbox.deleteSnapshot(plain.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(plain.snapshotId), false)
  assert.equal(await Sandbox.deleteSnapshot(named.snapshotId), true)
  // Deleted with a sandbox running from it: that sandbox keeps its files.
  assert.equal((await fromName.commands.run('ls /home/user >/dev/null && echo ok')).stdout, 'ok\n')
})

test(`${pkg}: fork gives running sandboxes with the source's files`, { skip: legacy && 'fork came after 2.13' }, async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/state.txt', 'state before fork')
  const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
  assert.equal(forks.length, 2)
  for (const f of forks) {
    assert.ok(f instanceof Sandbox, String(f))
    made.push(f.sandboxId)
    assert.notEqual(f.sandboxId, sbx.sandboxId)
    assert.equal(await f.isRunning(), true)
    assert.equal(await f.files.read('/home/user/state.txt'), 'state before fork')
  }
  await forks[0].files.write('/home/user/state.txt', 'modified in fork')
  assert.equal(await sbx.files.read('/home/user/state.txt'), 'state before fork')
  assert.equal(await forks[1].files.read('/home/user/state.txt'), 'state before fork')
  assert.equal(await sbx.isRunning(), true)
  const [byId] = await Sandbox.fork(sbx.sandboxId)
  made.push(byId.sandboxId)
  assert.equal(await byId.isRunning(), true)
  const gone = await create()
  await gone.kill()
  const { SandboxNotFoundError } = await import(pkg)
  await assert.rejects(gone.fork(), (err) => err instanceof SandboxNotFoundError)
})

// A server whose answer it made up at start and holds only in its memory.
async function serveMemory(sbx, port) {
  await sbx.commands.run(`python3 -c 'import http.server, os
v = os.urandom(8).hex().encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(v)
http.server.HTTPServer(("", ${port}), H).serve_forever()'`, { background: true })
  for (let i = 0; i < 100; i++) {
    const res = await get(sbx.getHost(port))
    if (res.status === 200) return res.body
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`the server on port ${port} never answered through the proxy`)
}

test(`${pkg}: snapshots and forks keep memory and processes on gVisor, files on native`, { skip: legacy && 'not what 2.13 is here for' }, async () => {
  const sbx = await create()
  const bg = await sbx.commands.run('sleep 3600', { background: true })
  const secret = await serveMemory(sbx, 8090)
  assert.match(secret, /^[0-9a-f]{16}$/)
  const snap = await sbx.createSnapshot()
  snapshots.push(snap.snapshotId)
  const fromSnap = await Sandbox.create(snap.snapshotId, { metadata: { run } })
  made.push(fromSnap.sandboxId)
  const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
  made.push(...forks.map((f) => f.sandboxId))
  for (const copy of [fromSnap, ...forks]) {
    const res = await get(copy.getHost(8090))
    const procs = await copy.commands.list()
    if (runtime === 'gvisor') {
      // The same server, its memory as it was, and envd's own processes.
      assert.equal(res.status, 200)
      assert.equal(res.body, secret)
      assert.ok(procs.some((c) => c.pid === bg.pid && c.args.join(' ').includes('sleep 3600')), JSON.stringify(procs))
    } else {
      assert.equal(res.status, 502, 'a process survived a native snapshot')
      assert.equal(procs.some((c) => c.pid === bg.pid), false)
    }
  }
})

test(`${pkg}: pause with keepMemory false keeps the files and boots afresh; onResume 'reboot' and onTimeout pause without memory too`, { skip: legacy && 'keepMemory came after 2.13' }, async () => {
  const sbx = await create({ envs: { TEST_VAR: 'sfisback' } })
  await sbx.files.write('/home/user/kept.txt', 'on disk')
  const bg = await sbx.commands.run('sleep 3600', { background: true })
  await sbx.commands.run('echo in-memory > /dev/shm/lost')
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect()
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.files.read('/home/user/kept.txt'), 'on disk')
  assert.equal((await sbx.commands.run('echo "$TEST_VAR"')).stdout, 'sfisback\n')
  assert.equal((await sbx.commands.list()).some((c) => c.pid === bg.pid), false, 'a process survived the boot')
  assert.equal((await sbx.commands.run('cat /dev/shm/lost 2>/dev/null || echo gone')).stdout, 'gone\n')

  // A pause that kept memory, resumed as a reboot (onResume came in 2.46).
  if (pkg !== 'e2b-2.45.0') {
    const bg2 = await sbx.commands.run('sleep 3600', { background: true })
    assert.equal(await sbx.pause(), true)
    await sbx.connect({ onResume: 'reboot' })
    assert.equal((await sbx.commands.list()).some((c) => c.pid === bg2.pid), false)
    assert.equal(await sbx.files.read('/home/user/kept.txt'), 'on disk')
  }

  // The deadline's pause without memory.
  const timed = await create({ timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  await timed.files.write('/home/user/t.txt', 'timed')
  for (let i = 0; i < 50 && (await timed.isRunning()); i++) await new Promise((r) => setTimeout(r, 200))
  assert.equal(await timed.isRunning(), false)
  await timed.connect()
  assert.equal(await timed.files.read('/home/user/t.txt'), 'timed')

  // setTimeout(0) ends it now as its deadline would: paused, without memory.
  const ended = await create({ timeoutMs: 600_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  await ended.files.write('/home/user/e.txt', 'ended')
  const bg3 = await ended.commands.run('sleep 3600', { background: true })
  await ended.setTimeout(0)
  assert.equal(await ended.isRunning(), false)
  await ended.connect()
  assert.equal(await ended.files.read('/home/user/e.txt'), 'ended')
  assert.equal((await ended.commands.list()).some((c) => c.pid === bg3.pid), false, 'a process survived setTimeout(0) with keepMemory false')
})

// Outbound rules, as e2b's own tests (packages/js-sdk/tests/sandbox/
// network.test.ts) use them, with two web servers of the test for 1.1.1.1
// and 8.8.8.8: nothing leaves the machine.
const web1 = process.env.SKIFF_WEB1
const web2 = process.env.SKIFF_WEB2
const noWorld = (legacy && 'network rules came after 2.13') || (!web1 && 'no SKIFF_WEB1: no servers to reach')

// reach runs curl in the sandbox: its answer, or a CommandExitError.
async function reach(sbx, url) {
  const res = await sbx.commands.run(`curl -sk --connect-timeout 3 --max-time 5 ${url}`)
  return res.stdout
}
const refused = (err) => err instanceof CommandExitError

test(`${pkg}: allowOut and denyOut decide what a sandbox reaches`, { skip: noWorld }, async () => {
  // Only web1 among all denied; allow wins over deny.
  let sbx = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [web1] } })
  assert.match(await reach(sbx, `http://${web1}/`), /^web1 /)
  await assert.rejects(reach(sbx, `http://${web2}/`), refused)
  // One address denied, the rest reached.
  sbx = await create({ network: { denyOut: [web2] } })
  await assert.rejects(reach(sbx, `https://${web2}/`), refused)
  assert.match(await reach(sbx, `https://${web1}/`), /^web1 /)
  // All denied.
  sbx = await create({ network: { denyOut: [ALL_TRAFFIC] } })
  await assert.rejects(reach(sbx, `http://${web1}/`), refused)
  await assert.rejects(reach(sbx, `http://${web2}/`), refused)
  // Names: by the TLS server name and the HTTP Host.
  sbx = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['allowed.test', '*.wild.test'] } })
  assert.match(await reach(sbx, 'https://allowed.test/'), /^web1 host=allowed.test sni=allowed.test/)
  assert.match(await reach(sbx, 'http://a.wild.test/'), /^web1 host=a.wild.test/)
  await assert.rejects(reach(sbx, 'https://other.test/'), refused)
  await assert.rejects(reach(sbx, `https://${web1}/`), refused)
  const info = await Sandbox.getInfo(sbx.sandboxId)
  assert.deepEqual(info.network?.allowOut, ['allowed.test', '*.wild.test'])
  assert.deepEqual(info.network?.denyOut, [ALL_TRAFFIC])
  // e2b's checks, with e2b's words.
  await assert.rejects(create({ network: { allowOut: ['allowed.test'] } }), /must include 'ALL_TRAFFIC' in deny out/)
  await assert.rejects(create({ network: { denyOut: ['example.com'] } }), /invalid denied CIDR example.com/)
  // allowInternetAccess false denies all but what allowOut allows.
  sbx = await create({ allowInternetAccess: false, network: { allowOut: [web1] } })
  assert.match(await reach(sbx, `http://${web1}/`), /^web1 /)
  await assert.rejects(reach(sbx, `http://${web2}/`), refused)
})

test(`${pkg}: updateNetwork replaces the rules, and {} clears them`, { skip: noWorld }, async () => {
  const sbx = await create()
  assert.match(await reach(sbx, `http://${web2}/`), /^web2 /)
  await sbx.updateNetwork({ denyOut: [web2] })
  await assert.rejects(reach(sbx, `http://${web2}/`), refused)
  assert.match(await reach(sbx, `http://${web1}/`), /^web1 /)
  await Sandbox.updateNetwork(sbx.sandboxId, { denyOut: [ALL_TRAFFIC], allowOut: [web2] })
  await assert.rejects(reach(sbx, `http://${web1}/`), refused)
  assert.match(await reach(sbx, `http://${web2}/`), /^web2 /)
  await sbx.updateNetwork({})
  assert.match(await reach(sbx, `http://${web1}/`), /^web1 /)
  assert.match(await reach(sbx, `http://${web2}/`), /^web2 /)
  // Rules survive a pause.
  await sbx.updateNetwork({ denyOut: [web1] })
  await sbx.pause()
  await sbx.connect()
  await assert.rejects(reach(sbx, `http://${web1}/`), refused)
  assert.match(await reach(sbx, `http://${web2}/`), /^web2 /)
  await assert.rejects(sbx.updateNetwork({ denyOut: ['not-a-cidr'] }), /invalid denied CIDR not-a-cidr/)
  await assert.rejects(Sandbox.updateNetwork('aaaaaaaaaaaaaaaaaaaa', {}), (err) => err.name === 'SandboxNotFoundError')
})

test(`${pkg}: maskRequestHost is the Host a sandbox's port gets`, { skip: legacy && 'network came after 2.13' }, async () => {
  const sbx = await create({ network: { maskRequestHost: 'custom-host.example.com:${PORT}' } })
  // A server that writes the headers it gets to a file.
  await sbx.files.write('/tmp/headers.py', `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        open('/tmp/headers.txt', 'w').write(str(self.headers))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'ok')
http.server.HTTPServer(('0.0.0.0', 8080), H).serve_forever()
`)
  await sbx.commands.run('python3 /tmp/headers.py', { background: true })
  const host = sbx.getHost(8080)
  let res
  for (let i = 0; i < 100; i++) {
    res = await get(host)
    if (res.status === 200) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(res.status, 200)
  const headers = await sbx.files.read('/tmp/headers.txt')
  assert.match(headers, /^Host: custom-host\.example\.com:8080$/m)
  assert.match(headers, new RegExp(`^X-Forwarded-Host: ${host.replace(/\./g, '\\.')}`, 'm'))
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).network?.maskRequestHost, 'custom-host.example.com:${PORT}')
})

test(`${pkg}: volumes: made, written and read without a sandbox, shared by two sandboxes, kept, deleted`, { skip: !Volume && 'volumes came after 2.13' }, async () => {
  const name = `vol-${run}-${pkg.replace(/[^a-z0-9]/g, '')}`
  const vol = await Volume.create(name)
  try {
    assert.match(vol.volumeId, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
    assert.equal(vol.name, name)
    await assert.rejects(Volume.create(name), /already exists/)
    await assert.rejects(Volume.create('not a name!'), /Invalid volume name/)
    assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === name))
    assert.equal((await Volume.getInfo(vol.volumeId)).name, name)
    // Another team sees none of it.
    await assert.rejects(Volume.getInfo(vol.volumeId, { apiKey: keyB }), VolumeNotFoundError)
    assert.ok(!(await Volume.list({ apiKey: keyB })).some((v) => v.volumeId === vol.volumeId))

    // Its content, with no sandbox running.
    const dir = await vol.makeDir('/data')
    assert.equal(dir.type, 'directory')
    const file = await vol.writeFile('/data/hello.txt', 'hello from the API')
    assert.equal(file.type, 'file')
    assert.equal(file.size, 18)
    assert.equal(await vol.readFile('/data/hello.txt'), 'hello from the API')
    assert.deepEqual((await vol.list('/data')).map((e) => e.name), ['hello.txt'])
    assert.equal(await vol.exists('/data/hello.txt'), true)
    assert.equal(await vol.exists('/data/missing.txt'), false)
    await assert.rejects(vol.readFile('/data/missing.txt'), VolumePathNotFoundError)
    assert.equal((await vol.updateMetadata('/data/hello.txt', { mode: 0o644 })).mode & 0o777, 0o644)
    await vol.writeFile('/data/gone.txt', 'x')
    await vol.remove('/data/gone.txt')
    assert.equal(await vol.exists('/data/gone.txt'), false)
    // A token of another volume opens nothing here.
    const other = new Volume(vol.volumeId, name, 'skv1.not.a.valid.token')
    await assert.rejects(other.readFile('/data/hello.txt'))

    // Two sandboxes mount it, by the Volume and by its name; user writes.
    const a = await create({ volumeMounts: { '/mnt/vol': vol } })
    const b = await create({ volumeMounts: { '/home/user/work': name } })
    assert.equal((await a.commands.run('cat /mnt/vol/data/hello.txt')).stdout, 'hello from the API')
    await a.commands.run('echo "from a" > /mnt/vol/from-a.txt && mkdir -p /mnt/vol/deep/er')
    assert.equal((await b.commands.run('cat /home/user/work/from-a.txt && stat -c %U /home/user/work/from-a.txt')).stdout, 'from a\nuser\n')
    assert.equal(await vol.readFile('/from-a.txt'), 'from a\n')
    assert.deepEqual((await Sandbox.getInfo(a.sandboxId)).volumeMounts, [{ name, path: '/mnt/vol' }])
    // Not deleted while mounted.
    await assert.rejects(Volume.destroy(vol.volumeId), /mounted/)
    // An unknown volume is refused at create, in e2b's words.
    await assert.rejects(create({ volumeMounts: { '/mnt/x': `missing-${run}` } }), /volume mount #0: volume 'missing-[0-9a-f]+' not found/)

    // The data outlives the sandboxes.
    await a.kill()
    await b.kill()
    const c = await create({ volumeMounts: { '/mnt/again': name } })
    assert.equal((await c.commands.run('cat /mnt/again/from-a.txt && ls /mnt/again/deep')).stdout, 'from a\ner\n')
    await c.kill()
  } finally {
    for (const id of made.splice(0)) await Sandbox.kill(id).catch(() => {})
    assert.equal(await Volume.destroy(vol.volumeId), true)
  }
  assert.equal(await Volume.destroy(vol.volumeId), false)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
})

// The e2b CLI (@e2b/cli), unmodified, against the same system: what people
// type. Once, beside the newest SDK (the CLI brings its own, deduplicated
// to it). NO_UPDATE_NOTIFIER keeps it from asking npm for a newer version.
const cliPath = new URL('./node_modules/@e2b/cli/dist/index.js', import.meta.url).pathname
const cliVersion = JSON.parse(readFileSync(new URL('./node_modules/@e2b/cli/package.json', import.meta.url))).version
async function cli(...args) {
  const run = promisify(execFile)(process.execPath, [cliPath, ...args], {
    env: { ...process.env, NO_UPDATE_NOTIFIER: '1', NO_COLOR: '1' },
    timeout: 120_000,
  })
  run.child.stdin.end() // `sandbox exec` reads a stdin that is not a terminal to its end
  return (await run).stdout
}

test(`e2b CLI ${cliVersion}: list, info, logs, metrics, exec, pause, resume, snapshots, kill`, { skip: pkg !== 'e2b' }, async () => {
  const sbx = await create({ metadata: { via: 'cli' } })
  const id = sbx.sandboxId
  await sbx.commands.run('echo from-a-command; echo to-stderr >&2')

  const listed = JSON.parse(await cli('sandbox', 'list', '-f', 'json', '-m', `run=${run}`))
  assert.deepEqual(listed.map((s) => [s.sandboxId, s.metadata.via, s.state]), [[id, 'cli', 'running']])
  const info = JSON.parse(await cli('sandbox', 'info', id, '-f', 'json'))
  assert.equal(info.sandboxId, id)
  assert.equal(info.templateID ?? info.templateId, 'base')

  // Logs: the CLI parses each line as a JSON record with a level, and
  // filters by its logger (here the line's source) and level.
  const logLines = async (...args) =>
    (await cli('sandbox', 'logs', id, '--format', 'json', ...args)).split('\n').filter(Boolean).map((l) => JSON.parse(l))
  const logs = await logLines()
  assert.ok(logs.some((l) => l.logger === 'stdout' && l.message === 'from-a-command'), JSON.stringify(logs))
  assert.ok(logs.some((l) => l.logger === 'stderr' && l.message === 'to-stderr'), JSON.stringify(logs))
  assert.ok(logs.every((l) => !Number.isNaN(Date.parse(l.timestamp)) && ['info', 'warn', 'error', 'debug'].includes(l.level)))
  assert.deepEqual((await logLines('--loggers', 'stdout')).map((l) => l.message), ['from-a-command'])

  const metrics = await cli('sandbox', 'metrics', id, '--format', 'json')
  assert.ok(metrics.trim().length > 0)

  assert.equal(await cli('sandbox', 'exec', id, '--', 'echo', 'from-exec'), 'from-exec\n')

  assert.match(await cli('sandbox', 'pause', id), /has been paused/)
  assert.equal((await Sandbox.getInfo(id)).state, 'paused')
  assert.match(await cli('sandbox', 'resume', id), /has been resumed/)
  assert.equal((await Sandbox.getInfo(id)).state, 'running')

  assert.match(await cli('sandbox', 'snapshot', 'create', id), /Created snapshot/)
  const snaps = JSON.parse(await cli('sandbox', 'snapshot', 'list', id, '-f', 'json'))
  assert.equal(snaps.length, 1)
  assert.match(await cli('sandbox', 'snapshot', 'delete', snaps[0].snapshotId), /has been deleted/)
  assert.deepEqual(JSON.parse(await cli('sandbox', 'snapshot', 'list', id, '-f', 'json')), [])

  assert.match(await cli('sandbox', 'kill', id), /has been killed/)
  assert.deepEqual(JSON.parse(await cli('sandbox', 'list', '-f', 'json', '-m', `run=${run}`)), [])
})

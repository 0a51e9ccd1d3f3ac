// The copied e2b tests that Skiff does not run, each with why. The rest must
// pass (e2e/upstream). A name is a test's full name as vitest reports it:
// its describe blocks' names and its own, joined by spaces.
export const skip = [
  // They reach 1.1.1.1, 8.8.8.8 or the internet, which these tests never
  // leave the machine for; e2e/sdk's outbound-rules cases make the same
  // checks against web servers of the test.
  ['internet access enabled internet access enabled', 'reaches the internet'],
  ['internet access default internet access default', 'reaches the internet'],
  ['allow only 1.1.1.1 allow specific IP with deny all traffic', 'reaches 1.1.1.1'],
  ['deny specific IP address deny specific IP address', 'reaches 8.8.8.8'],
  ['allow takes precedence over deny allow takes precedence over deny', 'reaches 1.1.1.1'],
  ['updateNetwork applies new egress rules denies a previously reachable IP after update', 'reaches 1.1.1.1'],
  ['updateNetwork clears existing rules when fields are omitted omitting fields replaces all egress rules', 'reaches 1.1.1.1'],
  // Header transforms (network.rules) and the MCP gateway are not in Skiff
  // (501, docs/e2b-compat.md); the transform test also needs e2b's httpbin
  // template.
  ['firewall transform injects headers injected header is reflected by the httpbin sidecar', 'network.rules: 501'],
  ['MCP gateway start failure kills the created sandbox', 'mcp: 501'],
]

// skipWith are more tests not run with a newer SDK than the tests' own,
// by the package's name in package.json.
export const skipWith = {
  'e2b-2.51.0': [
    // The SDK of the tests' commit refuses count 0 itself; 2.51 sends it,
    // with the test's placeholder key, and the API checks the key first
    // (401), as e2b's does (its OpenAPI validator checks security before
    // the body).
    ['fork with count lower than 1 fails', 'SDK 2.51 leaves count to the API, which answers the placeholder key first'],
  ],
}

// pattern is vitest's --testNamePattern that runs every test but those
// (and, with pkg, those of skipWith[pkg]).
export function pattern(pkg) {
  const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  const names = [...skip, ...(skipWith[pkg] ?? [])].map(([name]) => esc(name))
  return `^(?!(?:${names.join('|')})$)`
}

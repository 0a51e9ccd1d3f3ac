import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vitest/config'
import { pattern } from './skip.mjs'

// SKIFF_E2B_PACKAGE runs the tests with another SDK of package.json (e2b,
// the tests' own, by default) in place of 'e2b'.
const pkg = process.env.SKIFF_E2B_PACKAGE || 'e2b'

// The CLI's tests import its src/user.ts (copied beside them) as 'src/user'.
const cliSrc = { find: /^src\//, replacement: fileURLToPath(new URL('./cli/src/', import.meta.url)) }

// As e2b's own config runs these (its 'unit' project), one file at a time:
// each test makes its own sandbox, on one machine.
export default defineConfig({
  resolve: { alias: pkg === 'e2b' ? [cliSrc] : [cliSrc, { find: /^e2b$/, replacement: pkg }] },
  test: {
    include: ['tests/**/*.test.ts', 'cli/tests/**/*.test.ts'],
    testNamePattern: new RegExp(pattern(pkg)),
    testTimeout: 60_000,
    hookTimeout: 60_000,
    fileParallelism: false,
    isolate: true,
    environment: 'node',
    globals: false,
  },
})

import { defineConfig } from 'vitest/config'
import { pattern } from './skip.mjs'

// SKIFF_E2B_PACKAGE runs the tests with another SDK of package.json (e2b,
// the tests' own, by default) in place of 'e2b'.
const pkg = process.env.SKIFF_E2B_PACKAGE || 'e2b'

// As e2b's own config runs these (its 'unit' project), one file at a time:
// each test makes its own sandbox, on one machine.
export default defineConfig({
  resolve: pkg === 'e2b' ? {} : { alias: { e2b: pkg } },
  test: {
    include: ['tests/**/*.test.ts'],
    testNamePattern: new RegExp(pattern(pkg)),
    testTimeout: 60_000,
    hookTimeout: 60_000,
    fileParallelism: false,
    isolate: true,
    environment: 'node',
    globals: false,
  },
})

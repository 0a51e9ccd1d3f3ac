import { defineConfig } from 'vitest/config'
import { pattern } from './skip.mjs'

// As e2b's own config runs these (its 'unit' project), one file at a time:
// each test makes its own sandbox, on one machine.
export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    testNamePattern: new RegExp(pattern()),
    testTimeout: 60_000,
    hookTimeout: 60_000,
    fileParallelism: false,
    isolate: true,
    environment: 'node',
    globals: false,
  },
})

// jest for the parts that need no browser (src/status.ts, src/notes.ts): TypeScript through
// ts-jest, as JupyterLab's extension template does.
module.exports = {
  testEnvironment: 'node',
  testMatch: ['<rootDir>/src/__tests__/**/*.spec.ts'],
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  }
};

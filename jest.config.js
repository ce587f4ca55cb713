// Unit tests for the panel's model and other DOM-free modules (jupyter_ext/tests).
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/jupyter_ext/tests'],
  testMatch: ['**/*.test.ts'],
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: 'tsconfig.test.json' }]
  }
};

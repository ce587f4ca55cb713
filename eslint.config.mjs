// Lint for the panel's TypeScript (run by `npm run lint`, from `make test`).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', 'jupyter_ext/labextension/', '.venv/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['jupyter_ext/**/*.ts'],
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        { selector: 'interface', format: ['PascalCase'], custom: { regex: '^I[A-Z]', match: true } }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none' }],
      eqeqeq: 'error',
      curly: 'error',
      'prefer-arrow-callback': 'error'
    }
  }
);

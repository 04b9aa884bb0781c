// eslint for the extension, with the conventions of JupyterLab's own packages: interfaces
// start with I, always braces, ===; formatting is prettier's (eslint-config-prettier).
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

export default defineConfig(
  { ignores: ['lib/', 'node_modules/', 'coverage/'] },
  js.configs.recommended,
  tseslint.configs.recommended,
  prettier,
  {
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        {
          selector: 'interface',
          format: ['PascalCase'],
          custom: { regex: '^I[A-Z]', match: true }
        }
      ],
      // JupyterLab's way: a class and its namespace of options and interfaces
      '@typescript-eslint/no-namespace': 'off',
      curly: 'error',
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  {
    files: ['**/*.js', '**/*.cjs'],
    languageOptions: { globals: { module: 'readonly', require: 'readonly' } },
    rules: { '@typescript-eslint/no-require-imports': 'off' }
  }
);

/**
 * The form's checks read the kernel's schema: for every field, the values the kernel side refuses
 * (kernelside.config.check_value) are the values the form marks, and the values it takes pass.
 * The schema and the verdicts come from the repository's own Python, never a copy.
 */
import { execFileSync } from 'child_process';
import * as path from 'path';

import { checkValue, valueFromText } from '../src/model';
import { IFieldSchema } from '../src/types';

const REPO = path.resolve(__dirname, '..', '..');
const PYTHON = path.join(REPO, '.venv', 'bin', 'python');

// Text a user could type in each kind of field, around the schema's bounds.
const VERDICTS = `
import json
from kernelside.config import FIELDS, check_value, schema
cases = []
for f in FIELDS:
    texts = []
    if f.type in ("int", "float"):
        for b in (f.minimum, f.maximum):
            if b is not None:
                texts += [str(int(b) - 1), str(int(b)), str(int(b) + 1)]
        texts += ["abc", "1.5" if f.type == "int" else "nan"]
    elif f.choices:
        texts += list(f.choices) + ["nonsense"]
    for text in texts:
        value = text
        if f.type == "int" and text.lstrip("-").isdigit():
            value = int(text)
        elif f.type == "float":
            try:
                value = float(text)
            except ValueError:
                pass
        try:
            check_value(f.name, value)
            ok = True
        except ValueError:
            ok = False
        cases.append([f.name, text, ok])
print(json.dumps({"schema": schema(), "cases": cases}))
`;

describe('form validation and the kernel schema', () => {
  const answer = JSON.parse(
    execFileSync(PYTHON, ['-c', VERDICTS], { cwd: REPO, encoding: 'utf8' })
  ) as { schema: IFieldSchema[]; cases: [string, string, boolean][] };
  const byName = new Map(answer.schema.map(f => [f.name, f]));

  it('has a case for every numeric field and every choice', () => {
    expect(answer.cases.length).toBeGreaterThan(20);
    expect(answer.cases).toContainEqual(['main_process_port', '65536', false]);
    expect(answer.cases).toContainEqual(['timeout', '0', false]);
  });

  it.each(answer.cases)('%s = %s: the kernel accepts it: %s; the form agrees', (name, text, ok) => {
    const field = byName.get(name)!;
    const error = checkValue(field, valueFromText(field, text));
    expect(error === null).toBe(ok);
  });
});

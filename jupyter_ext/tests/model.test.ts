import { ConfigModel, parseScalar } from '../src/model';
import { configResponse } from './fixtures';

function loaded(values: Record<string, unknown> = {}): ConfigModel {
  const model = new ConfigModel();
  model.load(configResponse(values));
  return model;
}

describe('ConfigModel', () => {
  it('starts clean with the values the server sent', () => {
    const model = loaded({ num_processes: 2 });
    expect(model.value('num_processes')).toBe(2);
    expect(model.isDirty()).toBe(false);
    expect(model.hasErrors).toBe(false);
  });

  it('marks a typed number as an unsaved change and sends it as a number', () => {
    const model = loaded();
    model.setText('num_processes', '3');
    expect(model.dirtyKeys()).toEqual(['num_processes']);
    expect(model.payload().num_processes).toBe(3);
  });

  it('treats an emptied nullable field as null (automatic)', () => {
    const model = loaded({ num_processes: 4 });
    model.setText('num_processes', '  ');
    expect(model.value('num_processes')).toBeNull();
    expect(model.errorFor('num_processes')).toBeNull();
  });

  it('reports text that is not a whole number, and numbers under the minimum', () => {
    const model = loaded();
    model.setText('num_processes', 'three');
    expect(model.errorFor('num_processes')).toMatch('whole number');
    model.setText('num_processes', '0');
    expect(model.errorFor('num_processes')).toBe('must be at least 1');
    expect(model.hasErrors).toBe(true);
  });

  it('rejects a choice the schema does not allow', () => {
    const model = loaded();
    model.setValue('mixed_precision', 'fp4');
    expect(model.errorFor('mixed_precision')).toBe('must be one of no, fp16, bf16, fp8');
  });

  it('reverts every unsaved change', () => {
    const model = loaded();
    model.setText('num_processes', '3');
    model.setRows('env', [{ key: 'A', value: '1' }]);
    model.revert();
    expect(model.isDirty()).toBe(false);
    expect(model.rows('env')).toEqual([]);
  });

  it('no longer counts a change as unsaved after loading the saved answer', () => {
    const model = loaded();
    model.setText('num_processes', '3');
    model.load(configResponse({ num_processes: 3 }));
    expect(model.isDirty()).toBe(false);
  });

  it('shows server field errors until that field is edited', () => {
    const model = loaded();
    model.setServerErrors({ timeout: 'got -1; allowed: a number >= 0 or empty' });
    expect(model.errorFor('timeout')).toMatch('allowed');
    model.setText('timeout', '5');
    expect(model.errorFor('timeout')).toBeNull();
  });

  it('keeps environment variables as strings and sub-config values as scalars', () => {
    const model = loaded();
    model.setRows('env', [
      { key: 'OMP_NUM_THREADS', value: '4' },
      { key: '', value: '' }
    ]);
    model.setRows('fsdp_config', [
      { key: 'fsdp_version', value: '2' },
      { key: 'fsdp_offload_params', value: 'false' },
      { key: 'fsdp_sharding_strategy', value: 'FULL_SHARD' }
    ]);
    expect(model.payload().env).toEqual({ OMP_NUM_THREADS: '4' });
    expect(model.payload().fsdp_config).toEqual({
      fsdp_version: 2,
      fsdp_offload_params: false,
      fsdp_sharding_strategy: 'FULL_SHARD'
    });
  });

  it('reports a variable set twice or a value without a name', () => {
    const model = loaded();
    model.setRows('env', [
      { key: 'A', value: '1' },
      { key: 'A', value: '2' }
    ]);
    expect(model.errorFor('env')).toBe('A is set twice');
    model.setRows('env', [{ key: ' ', value: 'x' }]);
    expect(model.errorFor('env')).toMatch('no name');
  });

  it('turns GPU checkboxes into gpu_ids, and every GPU into "all"', () => {
    const model = loaded();
    const gpus = [0, 1, 2];
    expect([...model.gpuSelection(gpus)]).toEqual([0, 1, 2]);
    model.setGpuSelected(1, false, gpus);
    expect(model.value('gpu_ids')).toBe('0,2');
    model.setGpuSelected(1, true, gpus);
    expect(model.value('gpu_ids')).toBe('all');
    model.setGpuSelected(0, false, gpus);
    model.setGpuSelected(1, false, gpus);
    model.setGpuSelected(2, false, gpus);
    expect(model.errorFor('gpu_ids')).toMatch('at least one GPU');
  });

  it('merges imported values into the draft without saving them', () => {
    const model = loaded();
    model.applyImport({ num_processes: 8, mixed_precision: 'bf16', not_ours: 1 });
    expect(model.dirtyKeys().sort()).toEqual(['mixed_precision', 'num_processes']);
    expect(model.payload()).not.toHaveProperty('not_ours');
  });

  it('groups fields in schema order, so a new Python key gets a place without TypeScript changes', () => {
    const response = configResponse();
    response.schema.push({ ...response.schema[0], name: 'new_key', group: 'brand_new' });
    const model = new ConfigModel();
    model.load(response);
    expect(model.groups().map(g => g.group)).toEqual([
      'processes',
      'precision',
      'run',
      'machines',
      'advanced',
      'brand_new'
    ]);
  });

  it('tells listeners about changes until they unsubscribe', () => {
    const model = loaded();
    let calls = 0;
    const stop = model.onChange(() => calls++);
    model.setText('num_processes', '2');
    stop();
    model.setText('num_processes', '3');
    expect(calls).toBe(1);
  });
});

describe('parseScalar', () => {
  it('reads numbers, booleans and JSON, and leaves other text alone', () => {
    expect(parseScalar('2')).toBe(2);
    expect(parseScalar('1e-3')).toBe(0.001);
    expect(parseScalar('true')).toBe(true);
    expect(parseScalar('[1, 2]')).toEqual([1, 2]);
    expect(parseScalar('FULL_SHARD')).toBe('FULL_SHARD');
    expect(parseScalar('{broken')).toBe('{broken');
  });
});

import {
  cellsToInsert,
  DISTRIBUTED_CELL_SOURCE,
  EXPORT_CELL_SOURCE,
  LOAD_EXT_SOURCE,
  needsLoadExt
} from '../src/cellTemplate';

describe('the inserted %%distributed cell', () => {
  it('starts with the cell magic and prints world_size', () => {
    expect(DISTRIBUTED_CELL_SOURCE.split('\n')[0]).toBe('%%distributed');
    expect(DISTRIBUTED_CELL_SOURCE).toContain('world_size == {world_size}');
  });

  it('comes after %load_ext kernelside in a notebook that has not loaded it', () => {
    expect(cellsToInsert(['import torch'])).toEqual([LOAD_EXT_SOURCE, DISTRIBUTED_CELL_SOURCE]);
  });

  it('comes alone when a cell already loads the extension', () => {
    expect(needsLoadExt(['import torch\n%load_ext kernelside'])).toBe(false);
    expect(needsLoadExt(['%reload_ext kernelside'])).toBe(false);
    expect(cellsToInsert(['%load_ext kernelside'])).toEqual([DISTRIBUTED_CELL_SOURCE]);
  });

  it('does not mistake another extension for kernelside', () => {
    expect(needsLoadExt(['%load_ext kernelside_extras'])).toBe(true);
  });
});

describe('the inserted %distributed_export cell', () => {
  it('runs the export line magic on a script name', () => {
    const lines = EXPORT_CELL_SOURCE.split('\n');
    expect(lines[lines.length - 1]).toBe('%distributed_export train_distributed.py');
  });

  it('also brings %load_ext kernelside when the notebook lacks it', () => {
    expect(cellsToInsert([], EXPORT_CELL_SOURCE)).toEqual([LOAD_EXT_SOURCE, EXPORT_CELL_SOURCE]);
    expect(cellsToInsert(['%load_ext kernelside'], EXPORT_CELL_SOURCE)).toEqual([
      EXPORT_CELL_SOURCE
    ]);
  });
});

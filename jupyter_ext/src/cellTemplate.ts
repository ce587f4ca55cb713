/** The cells that "Insert %%distributed cell" adds to a notebook. */

export const LOAD_EXT_SOURCE = '%load_ext kernelside';

export const DISTRIBUTED_CELL_SOURCE = [
  '%%distributed',
  '# Runs in every worker with the settings saved in the "Distributed launch" panel.',
  '# rank and world_size are set and torch.distributed is initialized;',
  '# only rank 0 prints here unless output is "all".',
  'print(f"rank {rank}: world_size == {world_size}")'
].join('\n');

/** Whether a notebook with these cell sources still needs `%load_ext kernelside`. */
export function needsLoadExt(sources: string[]): boolean {
  return !sources.some(source => /^\s*%(load_ext|reload_ext)\s+kernelside\b/m.test(source));
}

/**
 * The sources to insert below the current cell, in order.
 *
 * Example: cellsToInsert([]) is ['%load_ext kernelside', DISTRIBUTED_CELL_SOURCE].
 */
export function cellsToInsert(existingSources: string[]): string[] {
  return needsLoadExt(existingSources)
    ? [LOAD_EXT_SOURCE, DISTRIBUTED_CELL_SOURCE]
    : [DISTRIBUTED_CELL_SOURCE];
}

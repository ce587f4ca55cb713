/** The cells that "Insert %%distributed cell" and "Insert %distributed_export cell" add to a notebook. */

export const LOAD_EXT_SOURCE = '%load_ext kernelside';

export const DISTRIBUTED_CELL_SOURCE = [
  '%%distributed',
  '# Runs in every worker with the settings saved in the "Distributed launch" panel.',
  '# rank and world_size are set and torch.distributed is initialized;',
  '# only rank 0 prints here unless output is "all".',
  'print(f"rank {rank}: world_size == {world_size}")'
].join('\n');

/**
 * Exports the last %%distributed cell as a script and prints the torchrun / accelerate launch
 * commands. The panel inserts it rather than running it: JupyterLab's side never talks to the
 * kernel, the user runs the cell.
 */
export const EXPORT_CELL_SOURCE = [
  '# Write the last %%distributed cell as a standalone script, with the commands to run it',
  '# under torchrun or accelerate launch (settings from the "Distributed launch" panel).',
  '%distributed_export train_distributed.py'
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
export function cellsToInsert(
  existingSources: string[],
  source: string = DISTRIBUTED_CELL_SOURCE
): string[] {
  return needsLoadExt(existingSources) ? [LOAD_EXT_SOURCE, source] : [source];
}

import { IConfigResponse, IFieldSchema } from '../src/types';

function field(
  name: string,
  type: IFieldSchema['type'],
  group: string,
  extra: Partial<IFieldSchema> = {}
): IFieldSchema {
  return {
    name,
    type,
    group,
    default: null,
    help: `${name} help`,
    choices: null,
    nullable: false,
    minimum: null,
    accelerate: false,
    ...extra
  };
}

/** A config answer shaped like the server's, with a few fields of each kind. */
export function configResponse(values: Record<string, unknown> = {}): IConfigResponse {
  return {
    path: '/root/nblaunch.yaml',
    display_path: 'nblaunch.yaml',
    root_dir: '/root',
    source: 'none',
    exists: false,
    read_from: null,
    values: {
      num_processes: null,
      gpu_ids: 'all',
      use_cpu: false,
      mixed_precision: 'no',
      timeout: null,
      env: {},
      fsdp_config: {},
      num_machines: 1,
      ...values
    },
    unknown_keys: [],
    schema: [
      field('num_processes', 'int', 'processes', { nullable: true, minimum: 1 }),
      field('gpu_ids', 'str', 'processes'),
      field('use_cpu', 'bool', 'processes'),
      field('mixed_precision', 'str', 'precision', { choices: ['no', 'fp16', 'bf16', 'fp8'] }),
      field('timeout', 'float', 'run', { nullable: true, minimum: 0 }),
      field('env', 'dict', 'run'),
      field('num_machines', 'int', 'machines', { minimum: 1 }),
      field('fsdp_config', 'dict', 'advanced')
    ],
    warnings: [],
    field_errors: {},
    error: null,
    features: { multi_machine: false }
  };
}

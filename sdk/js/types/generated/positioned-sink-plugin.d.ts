/// <reference path="./interfaces/weir-sink-blobstore.d.ts" />
/// <reference path="./interfaces/weir-sink-log.d.ts" />
/// <reference path="./interfaces/weir-sink-positions.d.ts" />
/// <reference path="./interfaces/weir-sink-sink.d.ts" />
/// <reference path="./interfaces/weir-sink-types.d.ts" />
declare module 'weir:sink/positioned-sink-plugin@0.1.0' {
  export type * as WeirSinkBlobstore010 from 'weir:sink/blobstore@0.1.0'; // import weir:sink/blobstore@0.1.0
  export type * as WeirSinkLog010 from 'weir:sink/log@0.1.0'; // import weir:sink/log@0.1.0
  export type * as WeirSinkTypes010 from 'weir:sink/types@0.1.0'; // import weir:sink/types@0.1.0
  export * as positions from 'weir:sink/positions@0.1.0'; // export weir:sink/positions@0.1.0
  export * as sink from 'weir:sink/sink@0.1.0'; // export weir:sink/sink@0.1.0
}

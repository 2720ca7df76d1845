declare module 'weir:sink/log@0.1.0' {
  /**
   * Writes one message.
   */
  export function log(level: Level, message: string): void;
  /**
   * How important a message is.
   * # Variants
   * 
   * ## `"trace"`
   * 
   * ## `"debug"`
   * 
   * ## `"info"`
   * 
   * ## `"warn"`
   * 
   * ## `"error"`
   */
  export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';
}

/**
 * The library's one rule for numbers: u64 values (ids, cents, times) are `bigint`
 * everywhere they come out of it; where they go in, a `number` is taken too, if it is a
 * safe integer (a double that is exactly that integer). Nothing is ever rounded.
 */

import { U64_MAX } from "./protocol.js";

/** A u64 as an argument: a bigint, or a number that is a safe non-negative integer. */
export type U64Input = bigint | number;

export function toU64(value: U64Input, field: string): bigint {
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value) || value < 0) {
      throw new RangeError(`${field}: ${value} is not a non-negative safe integer (pass a bigint)`);
    }
    return BigInt(value);
  }
  if (typeof value !== "bigint" || value < 0n || value > U64_MAX) {
    throw new RangeError(`${field}: ${String(value)} is not a u64`);
  }
  return value;
}

export function toU32(value: number, field: string): number {
  if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw new RangeError(`${field}: ${value} is not a u32`);
  }
  return value;
}

"use strict";
/*
 * Scenario harness for @azure/service-bus (the JavaScript SDK) against minibroker (issue 17).
 *
 * A scenario is one async function `(ctx) => {...}` registered with `scenario(name, fn)`; it drives the SDK
 * through `ctx.client` (a ServiceBusClient on the emulator connection string) and reports what it saw with
 * `ctx.emit({...})` (one JSON line on stdout, tagged with the scenario's name). `await ctx.step(label)` prints
 * `{"scenario": ..., "step": label}` and waits for one line on stdin: the Python side does what the step asks
 * (e.g. advances the broker's virtual clock) and then answers, so time-dependent scenarios stay deterministic.
 * `run(spec)` plays the scenarios named in spec.scenarios one after the other on one client; an exception in
 * one is printed as `{"scenario": ..., "error": ...}` and the next still runs; the last line is {"done": true}.
 *
 * Adding a scenario (sessions, rules, ...) is one `scenario(...)` call in scenarios.js.
 */
const readline = require("readline");
const { ServiceBusClient } = require("@azure/service-bus");

const registry = new Map();

/** Register `fn` as the scenario `name`. */
function scenario(name, fn) {
  if (registry.has(name)) throw new Error(`scenario ${name} registered twice`);
  registry.set(name, fn);
}

function print(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

/** A received message's fields as JSON: longs as strings, dates as ISO strings, bytes as {"bytes": base64}. */
function describe(message) {
  const out = {};
  for (const key of [
    "messageId", "body", "sequenceNumber", "enqueuedTimeUtc", "lockedUntilUtc", "lockToken", "deliveryCount",
    "applicationProperties", "deadLetterReason", "deadLetterErrorDescription", "deadLetterSource", "state",
    "scheduledEnqueueTimeUtc", "subject", "correlationId", "contentType", "sessionId",
  ]) {
    const value = message[key];
    if (value !== undefined) out[key] = jsonValue(value);
  }
  return out;
}

function jsonValue(value) {
  if (value === null || value === undefined) return null;
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) return { bytes: Buffer.from(value).toString("base64") };
  if (value instanceof Date) return value.toISOString();
  if (typeof value === "object" && typeof value.toNumber === "function" && "low" in value) return value.toString();
  if (Array.isArray(value)) return value.map(jsonValue);
  if (typeof value === "object") {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = jsonValue(v);
    return out;
  }
  return value;
}

/** A body as the spec gives it: {"bytes": base64} becomes a Buffer, anything else is passed as is. */
function bodyFrom(spec) {
  if (spec !== null && typeof spec === "object" && typeof spec.bytes === "string" && Object.keys(spec).length === 1) {
    return Buffer.from(spec.bytes, "base64");
  }
  return spec;
}

function lineReader() {
  const pending = [];
  const waiters = [];
  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", (line) => (waiters.length ? waiters.shift()(line) : pending.push(line)));
  rl.on("close", () => {
    while (waiters.length) waiters.shift()(null);
  });
  return {
    next: () => (pending.length ? Promise.resolve(pending.shift()) : new Promise((resolve) => waiters.push(resolve))),
    close: () => rl.close(),
  };
}

async function run(spec) {
  const client = new ServiceBusClient(spec.connection, {
    retryOptions: { maxRetries: 0, timeoutInMs: spec.timeoutMs || 5000 },
  });
  const stdin = lineReader();
  try {
    for (const name of spec.scenarios) {
      const fn = registry.get(name);
      const emit = (line) => print({ scenario: name, ...jsonValue(line) });
      const ctx = {
        client,
        spec,
        emit,
        describe,
        bodyFrom,
        /** A unique entity name for this scenario. */
        entity: (suffix = "") => `js-${name}${suffix}`,
        /** Ask the Python side to do `label` (e.g. advance the clock), wait until it says done. */
        step: async (label, args = {}) => {
          print({ scenario: name, step: label, ...args });
          const answer = await stdin.next();
          if (answer === null) throw new Error(`stdin closed while waiting for step ${label}`);
        },
        /** Receive up to `count` messages, waiting at most `waitMs` for the first. */
        receive: (receiver, count, waitMs = 2000) =>
          receiver.receiveMessages(count, { maxWaitTimeInMs: waitMs, maxTimeAfterFirstMessageInMs: 200 }),
      };
      if (fn === undefined) {
        emit({ error: `unknown scenario ${name}` });
        continue;
      }
      try {
        await fn(ctx);
      } catch (err) {
        emit({ error: `${err && err.name}: ${err && err.message}`, code: err && err.code });
      }
    }
  } finally {
    stdin.close();
    await client.close();
  }
  print({ done: true });
}

module.exports = { scenario, run, describe, jsonValue, bodyFrom };

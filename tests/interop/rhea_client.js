#!/usr/bin/env node
// One AMQP 1.0 scenario against minibroker, played by rhea (the JavaScript client).
//
// Usage: node rhea_client.js '<json spec>'    or    node rhea_client.js - < spec.json
//
// Spec fields:
//   url          "amqp://127.0.0.1:PORT" (required; SASL ANONYMOUS is used)
//   scenario     "send" | "receive" | "fanout"
//   address      node address
//   capabilities optional list of terminus capabilities (e.g. ["topic"]) for every link opened
//   messages     ("send", "fanout") messages to send, each {body, subject, message_id,
//                application_properties, message_annotations}; values use the typed JSON below
//   count        ("receive") messages to wait for; ("fanout") defaults to messages.length
//   credit       ("receive") link credit to grant, default count
//   selector     ("receive") JMS selector, sent as the source filter "jms-selector"
//   quiet_ms     ("receive") after `count` messages, keep listening this long for unexpected extras
//   receivers    ("fanout") how many receivers, default 2
//
// Typed JSON, both ways: {"$binary": base64} is an AMQP binary (a Buffer); as a message body,
// {"$data": base64} is a data section; {"$symbol": s}, {"$long": n}, {"$ulong": n}, {"$int": n},
// {"$uint": n}, {"$double": n} are those AMQP types (input only). Received values print as plain JSON,
// with binaries as {"$binary": base64}, a data section body as {"$data": base64} (a list of base64 strings
// for several sections), an amqp-sequence body as {"$sequence": list} (a list of lists for several),
// timestamps as {"$timestamp": ms} and other described values as {"$described": [descriptor, value]}.
//
// Output: one JSON line per sent message ({"sent": i, "outcome": "accepted"}) or received message
// ({"receiver": i, "body": ..., "application_properties": ..., "message_annotations": ...,
// "subject": ..., "message_id": ...}), then {"done": true}. Exits 0 only after the broker answered
// our connection close; 1 on any error; 2 after a 10 s guard timeout.
'use strict';

const rhea = require('rhea');

const GUARD_MS = 10000;

function fail(code, what) {
    process.stderr.write(`rhea_client: ${what}\n`);
    process.exit(code);
}

const guard = setTimeout(() => fail(2, `timed out after ${GUARD_MS} ms (${progress()})`), GUARD_MS);

let spec;
try {
    // "-" reads the spec from standard input (a spec too big for one argument: argv strings stop at 128 KiB)
    spec = JSON.parse(process.argv[2] === '-' ? require('fs').readFileSync(0, 'utf8') : process.argv[2]);
} catch (err) {
    fail(1, `bad spec: ${err}`);
}

function out(obj) {
    process.stdout.write(JSON.stringify(obj) + '\n');
}

// -- typed JSON ------------------------------------------------------------------------------------
function toRhea(value) {
    if (Array.isArray(value)) return value.map(toRhea);
    if (value === null || typeof value !== 'object') return value;
    const keys = Object.keys(value);
    if (keys.length === 1 && keys[0].startsWith('$')) {
        const v = value[keys[0]];
        switch (keys[0]) {
        case '$binary': return Buffer.from(v, 'base64');
        case '$symbol': return rhea.types.wrap_symbol(v);
        case '$long': return rhea.types.wrap_long(v);
        case '$ulong': return rhea.types.wrap_ulong(v);
        case '$int': return rhea.types.wrap_int(v);
        case '$uint': return rhea.types.wrap_uint(v);
        case '$double': return rhea.types.wrap_double(v);
        default: fail(1, `unknown typed value ${keys[0]}`);
        }
    }
    const result = {};
    for (const k of keys) result[k] = toRhea(value[k]);
    return result;
}

function bodyToRhea(body) {
    if (body !== null && typeof body === 'object' && Object.keys(body).length === 1 && '$data' in body) {
        return rhea.message.data_section(Buffer.from(body.$data, 'base64'));
    }
    return toRhea(body);
}

function toJson(value) {
    if (value === undefined || value === null) return null;
    if (Buffer.isBuffer(value) || value instanceof Uint8Array) return {$binary: Buffer.from(value).toString('base64')};
    if (value instanceof Date) return {$timestamp: value.getTime()};
    if (Array.isArray(value)) return value.map(toJson);
    if (typeof value === 'object') {
        if (value.constructor && value.constructor.name === 'Section') {
            // a body of data or amqp-sequence sections: one section's content, or a list when multiple
            const kind = value.typecode === 0x75 ? '$data' : value.typecode === 0x76 ? '$sequence' : '$section';
            const content = toJson(value.content);
            if (value.typecode !== 0x75) return {[kind]: content};
            return {[kind]: value.multiple ? content.map((b) => b.$binary) : content.$binary};
        }
        if (value.descriptor !== undefined) {
            return {$described: [toJson(value.descriptor.value), toJson(value.value)]};
        }
        const result = {};
        for (const k of Object.keys(value)) result[k] = toJson(value[k]);
        return result;
    }
    return value;
}

function describe(message, receiver) {
    return {
        receiver,
        body: toJson(message.body),
        application_properties: toJson(message.application_properties),
        message_annotations: toJson(message.message_annotations),
        subject: toJson(message.subject),
        message_id: toJson(message.message_id),
    };
}

function outgoing(m) {
    const msg = {body: bodyToRhea(m.body)};
    for (const field of ['subject', 'message_id', 'application_properties', 'message_annotations']) {
        if (m[field] !== undefined && m[field] !== null) msg[field] = toRhea(m[field]);
    }
    return msg;
}

// -- scenario --------------------------------------------------------------------------------------
const state = {closing: false, sent: 0, settled: 0, received: []};

function progress() {
    return `sent ${state.sent}, settled ${state.settled}, received ${state.received.map((n) => n || 0).join('/')}`;
}

const url = new URL(spec.url);
const container = rhea.create_container({id: 'minibroker-rhea-interop'});
const connection = container.connect({
    host: url.hostname,
    port: Number(url.port),
    username: 'anonymous', // no password: rhea offers SASL ANONYMOUS
    reconnect: false,
    idle_time_out: 0,
});

function finish() {
    if (state.closing) return;
    state.closing = true;
    connection.close(); // exit once the broker answers with its close
}

function terminus(extra) {
    const t = Object.assign({address: spec.address}, extra || {});
    if (spec.capabilities) t.capabilities = spec.capabilities;
    return t;
}

function openSender(onAllSettled) {
    const messages = spec.messages || [];
    const sender = connection.open_sender({target: terminus(), autosettle: true});
    const pump = () => {
        while (state.sent < messages.length && sender.sendable()) {
            sender.send(outgoing(messages[state.sent]));
            state.sent += 1;
        }
    };
    sender.on('sendable', pump);
    const settle = (outcome) => (context) => {
        const index = state.settled;
        state.settled += 1;
        if (outcome !== 'accepted') {
            fail(1, `message ${index} was ${outcome}: ${JSON.stringify(context.delivery.remote_state || null)}`);
        }
        out({sent: index, outcome});
        if (state.settled === messages.length) onAllSettled();
    };
    for (const outcome of ['accepted', 'rejected', 'released', 'modified']) sender.on(outcome, settle(outcome));
    if (messages.length === 0) onAllSettled();
    return sender;
}

function scenarioSend() {
    openSender(finish);
}

function scenarioReceive() {
    const count = spec.count;
    const credit = spec.credit === undefined ? count : spec.credit;
    const source = spec.selector ? terminus({filter: rhea.filter.selector(spec.selector)}) : terminus();
    const receiver = connection.open_receiver({source, credit_window: 0, autoaccept: true});
    state.received = [0];
    receiver.on('receiver_open', () => receiver.add_credit(credit));
    receiver.on('message', (context) => {
        state.received[0] += 1;
        out(describe(context.message, 0));
        if (state.received[0] === count) {
            if (spec.quiet_ms) setTimeout(finish, spec.quiet_ms);
            else finish();
        }
    });
    if (count === 0) setTimeout(finish, spec.quiet_ms || 0);
}

function scenarioFanout() {
    const messages = spec.messages || [];
    const count = spec.count === undefined ? messages.length : spec.count;
    const n = spec.receivers || 2;
    state.received = new Array(n).fill(0);
    let open = 0;
    let sent = false;
    const maybeDone = () => {
        if (sent && state.received.every((got) => got === count)) finish();
    };
    for (let i = 0; i < n; i++) {
        const receiver = connection.open_receiver({source: terminus(), credit_window: 0, autoaccept: true});
        receiver.on('receiver_open', () => {
            receiver.add_credit(Math.max(count, 1));
            open += 1;
            if (open === n) {
                openSender(() => {
                    sent = true;
                    maybeDone();
                });
            }
        });
        receiver.on('message', (context) => {
            state.received[i] += 1;
            out(describe(context.message, i));
            maybeDone();
        });
    }
}

const scenarios = {send: scenarioSend, receive: scenarioReceive, fanout: scenarioFanout};

connection.on('connection_open', () => {
    const run = scenarios[spec.scenario];
    if (!run) fail(1, `unknown scenario ${JSON.stringify(spec.scenario)}`);
    run();
});

connection.on('connection_close', () => {
    if (!state.closing) fail(1, `broker closed the connection: ${JSON.stringify(connection.error || null)}`);
    clearTimeout(guard);
    // exit once stdout is flushed: a pipe write may still be pending, and process.exit() would cut it
    process.stdout.write(JSON.stringify({done: true}) + '\n', () => process.exit(0));
});

const errorEvent = (what) => (context) => {
    const endpoint = context[what] || context.connection;
    const error = (endpoint && endpoint.error) || context.error;
    fail(1, `${what} error: ${error && (error.description || error.message || JSON.stringify(error))}`);
};
connection.on('connection_error', errorEvent('connection'));
connection.on('session_error', errorEvent('session'));
connection.on('sender_error', errorEvent('sender'));
connection.on('receiver_error', errorEvent('receiver'));
connection.on('sender_close', (context) => {
    if (!state.closing) fail(1, `broker detached sender: ${JSON.stringify(context.sender.error || null)}`);
});
connection.on('receiver_close', (context) => {
    if (!state.closing) fail(1, `broker detached receiver: ${JSON.stringify(context.receiver.error || null)}`);
});
connection.on('error', (e) => fail(1, `error: ${(e && e.error) || e}`));
connection.on('protocol_error', (e) => fail(1, `protocol error: ${(e && e.error) || e}`));
connection.on('disconnected', (context) => {
    fail(1, `disconnected${state.closing ? ' before the broker answered our close' : ''}: ${context.error || ''}`);
});

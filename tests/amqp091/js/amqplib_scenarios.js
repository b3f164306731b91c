#!/usr/bin/env node
// AMQP 0-9-1 scenarios against minibroker, played by amqplib (node's 0-9-1 client, promise API).
//
// Usage: node amqplib_scenarios.js '{"url": "amqp://guest:guest@127.0.0.1:PORT/", "scenario": NAME}'
//
// Each scenario prints what amqplib showed it as JSON lines ({"what": ..., ...}); test_amqplib.py asserts on
// them. Message bodies print as UTF-8 strings. The last line is {"done": true} after the connection closed
// cleanly; exit 1 on an error the scenario did not expect, 2 after a 10 s guard time-out.
'use strict';

const amqp = require('amqplib');

const GUARD_MS = 10000;

function fail(code, what) {
    process.stderr.write(`amqplib_scenarios: ${what}\n`);
    process.exit(code);
}

const guard = setTimeout(() => fail(2, `timed out after ${GUARD_MS} ms`), GUARD_MS);
const spec = JSON.parse(process.argv[2]);

function out(obj) {
    process.stdout.write(JSON.stringify(obj) + '\n');
}

function message(msg) {
    if (!msg) return null;
    const { fields, properties } = msg;
    return {
        body: msg.content.toString('utf8'),
        exchange: fields.exchange,
        routingKey: fields.routingKey,
        redelivered: fields.redelivered,
        messageCount: fields.messageCount === undefined ? null : fields.messageCount,
        contentType: properties.contentType === undefined ? null : properties.contentType,
        headers: properties.headers === undefined ? null : properties.headers,
        deliveryMode: properties.deliveryMode === undefined ? null : properties.deliveryMode,
        messageId: properties.messageId === undefined ? null : properties.messageId,
    };
}

// The deliveries of a consumer, one promise per delivery in order.
function deliveries(ch, queue, options) {
    const waiting = [];
    const arrived = [];
    const next = () => new Promise((resolve) => {
        if (arrived.length) resolve(arrived.shift());
        else waiting.push(resolve);
    });
    const started = ch.consume(queue, (msg) => {
        if (waiting.length) waiting.shift()(msg);
        else arrived.push(msg);
    }, options);
    return { started, next, pending: () => arrived.length };
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const scenarios = {
    // publish with properties, consume, ack; the queue is empty after
    async publish_consume_ack(conn) {
        const ch = await conn.createChannel();
        const ok = await ch.assertQueue('orders');
        out({ what: 'declared', queue: ok.queue, messageCount: ok.messageCount, consumerCount: ok.consumerCount });
        ch.sendToQueue('orders', Buffer.from('{"id": 1}'), {
            contentType: 'application/json', headers: { kind: 'order', n: 7 }, persistent: true, messageId: 'm-1',
        });
        const consumer = deliveries(ch, 'orders', { noAck: false });
        const { consumerTag } = await consumer.started;
        const msg = await consumer.next();
        out({ what: 'delivered', ...message(msg), tagged: msg.fields.consumerTag === consumerTag });
        ch.ack(msg);
        await ch.cancel(consumerTag);
        const after = await ch.checkQueue('orders');
        out({ what: 'after', messageCount: after.messageCount, consumerCount: after.consumerCount });
        await ch.close();
    },

    // a confirm channel: every publish's callback, then waitForConfirms
    async confirms(conn) {
        const ch = await conn.createConfirmChannel();
        await ch.assertQueue('confirmed');
        await ch.assertQueue('small', { arguments: { 'x-max-length': 1, 'x-overflow': 'reject-publish' } });
        const results = [];
        for (let n = 0; n < 20; n++) {
            ch.sendToQueue('confirmed', Buffer.from(String(n)), {}, (err) => results.push(err ? 'nack' : 'ack'));
        }
        await ch.waitForConfirms();
        out({ what: 'confirmed', results });
        const small = [];
        for (const body of ['1', '2']) {
            ch.sendToQueue('small', Buffer.from(body), {}, (err) => small.push(err ? 'nack' : 'ack'));
        }
        let waited = 'ok';
        try {
            await ch.waitForConfirms();
        } catch (err) {
            waited = 'rejected';
        }
        out({ what: 'small', results: small, waited });
        const depth = await ch.checkQueue('confirmed');
        out({ what: 'depth', messageCount: depth.messageCount });
        await ch.close();
    },

    // prefetch 2: two deliveries, none more until an ack
    async prefetch(conn) {
        const ch = await conn.createChannel();
        await ch.assertQueue('limited');
        for (let n = 0; n < 5; n++) ch.sendToQueue('limited', Buffer.from(String(n)));
        await ch.prefetch(2);
        const consumer = deliveries(ch, 'limited', { noAck: false });
        await consumer.started;
        const first = [await consumer.next(), await consumer.next()];
        await pause(300); // (a third delivery must not come: nothing to wait for)
        out({ what: 'held', bodies: first.map((m) => message(m).body), more: consumer.pending() });
        ch.ack(first[1], true); // allUpTo: both
        const more = [await consumer.next(), await consumer.next()];
        await pause(300);
        out({ what: 'then', bodies: more.map((m) => message(m).body), more: consumer.pending() });
        ch.ackAll();
        await ch.close();
    },

    // basic.get: message counts, an empty queue answers false
    async get(conn) {
        const ch = await conn.createChannel();
        await ch.assertQueue('counted');
        for (let n = 0; n < 3; n++) ch.sendToQueue('counted', Buffer.from(String(n)));
        const got = [];
        for (let n = 0; n < 3; n++) {
            const msg = await ch.get('counted', { noAck: false });
            got.push(message(msg));
            ch.ack(msg);
        }
        out({ what: 'got', got });
        out({ what: 'empty', got: await ch.get('counted', { noAck: true }) });
        await ch.close();
    },

    // each exchange type, and an exchange-to-exchange binding
    async exchanges(conn) {
        const ch = await conn.createChannel();
        const routes = {
            direct: { bindings: { d1: 'a', d2: 'b' }, keys: ['a', 'b', 'c'] },
            fanout: { bindings: { f1: '', f2: 'x' }, keys: ['k'] },
            topic: { bindings: { t1: 'stock.*.nyse', t2: 'stock.#' }, keys: ['stock.ibm.nyse', 'stock.ibm', 'bond'] },
        };
        for (const [type, { bindings, keys }] of Object.entries(routes)) {
            await ch.assertExchange(`ex.${type}`, type, { durable: false });
            for (const [queue, key] of Object.entries(bindings)) {
                await ch.assertQueue(queue);
                await ch.bindQueue(queue, `ex.${type}`, key);
            }
            for (const key of keys) ch.publish(`ex.${type}`, key, Buffer.from(key));
        }
        await ch.assertExchange('ex.headers', 'headers');
        await ch.assertQueue('h-all');
        await ch.assertQueue('h-any');
        await ch.bindQueue('h-all', 'ex.headers', '', { 'x-match': 'all', format: 'pdf', type: 'report' });
        await ch.bindQueue('h-any', 'ex.headers', '', { 'x-match': 'any', format: 'pdf', type: 'report' });
        ch.publish('ex.headers', '', Buffer.from('1'), { headers: { format: 'pdf', type: 'report' } });
        ch.publish('ex.headers', '', Buffer.from('2'), { headers: { format: 'pdf' } });
        ch.publish('ex.headers', '', Buffer.from('3'), { headers: { format: 'zip' } });
        await ch.bindExchange('ex.fanout', 'ex.topic', 'audit.#');
        ch.publish('ex.topic', 'audit.login', Buffer.from('audit'));
        const queues = ['d1', 'd2', 'f1', 'f2', 't1', 't2', 'h-all', 'h-any'];
        const found = {};
        for (const queue of queues) {
            found[queue] = [];
            let msg;
            while ((msg = await ch.get(queue, { noAck: true }))) found[queue].push(msg.content.toString());
        }
        out({ what: 'routed', found });
        await ch.close();
    },

    // nack with requeue: redelivered; nack without: gone; allUpTo
    async nack_requeue(conn) {
        const ch = await conn.createChannel();
        await ch.assertQueue('work');
        for (const body of ['a', 'b']) ch.sendToQueue('work', Buffer.from(body));
        const first = [await ch.get('work'), await ch.get('work')];
        ch.nack(first[1], true, true); // allUpTo, requeue: both back
        const again = [await ch.get('work'), await ch.get('work')];
        out({ what: 'again', got: again.map(message) });
        ch.nack(again[0], false, false); // dropped
        ch.reject(again[1], true); // back once more
        const last = await ch.get('work');
        out({ what: 'last', got: message(last) });
        ch.ack(last);
        out({ what: 'empty', got: await ch.get('work') });
        await ch.close();
    },

    // a mandatory publish nothing routes comes back in a 'return' event
    async returned(conn) {
        const ch = await conn.createConfirmChannel();
        const returned = new Promise((resolve) => ch.on('return', resolve));
        let confirmed = null;
        ch.publish('', 'nowhere', Buffer.from('lost'), { mandatory: true }, (err) => {
            confirmed = err ? 'nack' : 'ack';
        });
        const msg = await returned;
        out({ what: 'returned', ...message(msg), replyCode: msg.fields.replyCode, replyText: msg.fields.replyText });
        await ch.waitForConfirms();
        out({ what: 'confirmed', confirmed });
        await ch.close();
    },

    // channel errors: a passive declare of a missing queue and a publish to a missing exchange close the
    // channel with 404; the connection carries on
    async channel_error(conn) {
        const ch = await conn.createChannel();
        const closed = new Promise((resolve) => ch.on('close', resolve));
        const errors = [];
        ch.on('error', (err) => errors.push({ code: err.code, message: err.message }));
        try {
            await ch.checkQueue('nowhere');
            out({ what: 'checked' });
        } catch (err) {
            out({ what: 'rejected', code: err.code, classId: err.classId, methodId: err.methodId, message: err.message });
        }
        await closed;
        out({ what: 'errors', errors });
        const other = await conn.createChannel();
        other.on('error', (err) => errors.push({ code: err.code, message: err.message }));
        const otherClosed = new Promise((resolve) => other.on('close', resolve));
        other.publish('no-such-exchange', 'k', Buffer.from('x'));
        await otherClosed;
        out({ what: 'publish error', error: errors[errors.length - 1] });
        const third = await conn.createChannel();
        const ok = await third.assertQueue('elsewhere');
        out({ what: 'after', queue: ok.queue });
        await third.close();
    },
};

async function main() {
    const play = scenarios[spec.scenario];
    if (!play) fail(1, `no scenario ${spec.scenario}`);
    const conn = await amqp.connect(spec.url);
    conn.on('error', (err) => fail(1, `connection error: ${err.message}`));
    await play(conn);
    await conn.close();
    out({ done: true });
    clearTimeout(guard);
}

main().catch((err) => fail(1, err && err.stack ? err.stack : String(err)));

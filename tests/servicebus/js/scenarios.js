"use strict";
/*
 * The @azure/service-bus scenarios of tests/servicebus/test_js_sdk.py, one `scenario(...)` each (see harness.js).
 * Run: node scenarios.js '{"connection": "...", "scenarios": ["send_receive", ...]}'
 */
const { scenario, run } = require("./harness");

scenario("send_kinds", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages({ body: "one", messageId: "m-one" });
  await sender.sendMessages([{ body: "list-a" }, { body: "list-b" }]);
  const batch = await sender.createMessageBatch();
  for (const body of ["batch-a", "batch-b", "batch-c"]) {
    if (!batch.tryAddMessage({ body })) throw new Error(`batch refused ${body}`);
  }
  await sender.sendMessages(batch);
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const got = [];
  while (got.length < 6) {
    const messages = await ctx.receive(receiver, 6 - got.length);
    if (messages.length === 0) break;
    for (const m of messages) {
      await receiver.completeMessage(m);
      got.push(m.body);
    }
  }
  ctx.emit({ bodies: got });
  ctx.emit({ after: (await ctx.receive(receiver, 1, 300)).length });
  await receiver.close();
});

scenario("fields", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages([
    { body: "text", applicationProperties: { color: "red", n: 7, ok: true } },
    { body: { nested: [1, 2, "three"] }, contentType: "application/json" },
    { body: Buffer.from([0, 1, 2, 255]) },
  ]);
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const messages = await ctx.receive(receiver, 3);
  for (const m of messages) {
    ctx.emit({ message: ctx.describe(m), bodyIsBuffer: Buffer.isBuffer(m.body) });
    await receiver.completeMessage(m);
  }
  await receiver.close();
});

scenario("abandon", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages({ body: "again" });
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const [first] = await ctx.receive(receiver, 1);
  await receiver.abandonMessage(first);
  const [second] = await ctx.receive(receiver, 1);
  ctx.emit({ first: ctx.describe(first), second: ctx.describe(second) });
  await receiver.completeMessage(second);
  await receiver.close();
});

scenario("dead_letter", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages({ body: "poison", messageId: "dl-1" });
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const [m] = await ctx.receive(receiver, 1);
  await receiver.deadLetterMessage(m, { deadLetterReason: "bad-input", deadLetterErrorDescription: "cannot parse" });
  ctx.emit({ left: (await ctx.receive(receiver, 1, 300)).length });
  await receiver.close();
  const dlq = ctx.client.createReceiver(queue, { subQueueType: "deadLetter" });
  const [dead] = await ctx.receive(dlq, 1);
  ctx.emit({ dead: ctx.describe(dead) });
  await dlq.completeMessage(dead);
  await dlq.close();
});

scenario("defer", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages({ body: "later" });
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const [m] = await ctx.receive(receiver, 1);
  await receiver.deferMessage(m);
  ctx.emit({ redelivered: (await ctx.receive(receiver, 1, 300)).length });
  const deferred = await receiver.receiveDeferredMessages([m.sequenceNumber]);
  ctx.emit({ deferred: deferred.map(ctx.describe), original: ctx.describe(m) });
  for (const d of deferred) await receiver.completeMessage(d);
  try {
    await receiver.receiveDeferredMessages([m.sequenceNumber]);
    ctx.emit({ again: "received" });
  } catch (err) {
    ctx.emit({ again: err.code });
  }
  await receiver.close();
});

scenario("schedule", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  const later = new Date(Date.parse(ctx.spec.now) + 3600 * 1000);
  const numbers = await sender.scheduleMessages([{ body: "s-1" }, { body: "s-2" }], later);
  const receiver = ctx.client.createReceiver(queue);
  ctx.emit({ scheduled: numbers, peeked: (await receiver.peekMessages(10)).map(ctx.describe) });
  await sender.cancelScheduledMessages([numbers[0]]);
  const afterCancel = await receiver.peekMessages(10, { fromSequenceNumber: numbers[0] });
  ctx.emit({ afterCancel: afterCancel.map(ctx.describe) });
  await ctx.step("advance", { seconds: 3601 });
  const due = await ctx.receive(receiver, 2);
  ctx.emit({ due: due.map(ctx.describe) });
  for (const m of due) await receiver.completeMessage(m);
  await sender.close();
  await receiver.close();
});

scenario("peek", async (ctx) => {
  const queue = ctx.entity();
  const receiver = ctx.client.createReceiver(queue);
  ctx.emit({ empty: (await receiver.peekMessages(5)).length });
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages([{ body: "p-1" }, { body: "p-2" }, { body: "p-3" }]);
  await sender.close();
  const peeked = await receiver.peekMessages(2);
  const rest = await receiver.peekMessages(5);
  const fromStart = await receiver.peekMessages(5, { fromSequenceNumber: peeked[0].sequenceNumber });
  ctx.emit({ peeked: peeked.map(ctx.describe), rest: rest.map(ctx.describe), fromStart: fromStart.map(ctx.describe) });
  const received = await ctx.receive(receiver, 3);
  ctx.emit({ received: received.map((m) => m.body) });
  for (const m of received) await receiver.completeMessage(m);
  await receiver.close();
});

scenario("renew_and_expire", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages({ body: "locked" });
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const [m] = await ctx.receive(receiver, 1);
  const before = m.lockedUntilUtc;
  await ctx.step("advance", { seconds: 30 });
  const renewed = await receiver.renewMessageLock(m);
  ctx.emit({ before: before, renewed: renewed, messageLockedUntil: m.lockedUntilUtc });
  await ctx.step("advance", { seconds: 45 });
  // 75 s after delivery, 45 s after the renewal: the renewed lock still holds
  await receiver.completeMessage(m);
  ctx.emit({ completedAfterRenew: true });

  const s2 = ctx.client.createSender(queue);
  await s2.sendMessages({ body: "expires" });
  await s2.close();
  const [e] = await ctx.receive(receiver, 1);
  await ctx.step("advance", { seconds: 61 });
  let settleError = null;
  try {
    await receiver.completeMessage(e);
  } catch (err) {
    settleError = { name: err.name, code: err.code };
  }
  let renewError = null;
  try {
    await receiver.renewMessageLock(e);
  } catch (err) {
    renewError = { name: err.name, code: err.code };
  }
  const [again] = await ctx.receive(receiver, 1);
  ctx.emit({ first: ctx.describe(e), settleError, renewError, again: again ? ctx.describe(again) : null });
  if (again) await receiver.completeMessage(again);
  await receiver.close();
});

scenario("receive_and_delete", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages([{ body: "gone-1" }, { body: "gone-2" }]);
  await sender.close();
  const receiver = ctx.client.createReceiver(queue, { receiveMode: "receiveAndDelete" });
  const got = await ctx.receive(receiver, 2);
  ctx.emit({ received: got.map(ctx.describe) });
  ctx.emit({ after: (await receiver.peekMessages(5)).length });
  await receiver.close();
});

scenario("max_delivery", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages({ body: "hopeless" });
  await sender.close();
  const receiver = ctx.client.createReceiver(queue);
  const counts = [];
  for (let i = 0; i < 10; i++) {
    const [m] = await ctx.receive(receiver, 1);
    if (!m) break;
    counts.push(m.deliveryCount);
    await receiver.abandonMessage(m);
  }
  ctx.emit({ counts, left: (await ctx.receive(receiver, 1, 300)).length });
  await receiver.close();
  const dlq = ctx.client.createReceiver(queue, { subQueueType: "deadLetter" });
  const [dead] = await ctx.receive(dlq, 1);
  ctx.emit({ dead: dead ? ctx.describe(dead) : null });
  if (dead) await dlq.completeMessage(dead);
  await dlq.close();
});

scenario("topic", async (ctx) => {
  const topic = ctx.entity();
  const one = ctx.client.createReceiver(topic, "one");
  const two = ctx.client.createReceiver(topic, "two");
  // attach both subscription receivers before the first send (a name first used by a sender is a queue)
  await one.peekMessages(1);
  await two.peekMessages(1);
  const sender = ctx.client.createSender(topic);
  await sender.sendMessages([{ body: "t-1" }, { body: "t-2" }]);
  await sender.close();
  for (const [name, receiver] of [["one", one], ["two", two]]) {
    const got = await ctx.receive(receiver, 2);
    for (const m of got) await receiver.completeMessage(m);
    ctx.emit({ subscription: name, bodies: got.map((m) => m.body) });
    await receiver.close();
  }
});

scenario("subscription_dead_letter", async (ctx) => {
  const topic = ctx.entity();
  const receiver = ctx.client.createReceiver(topic, "audit");
  await receiver.peekMessages(1); // makes the topic and its subscription before the first send
  const sender = ctx.client.createSender(topic);
  await sender.sendMessages({ body: "rejected", messageId: "sub-dl-1" });
  await sender.close();
  const [m] = await ctx.receive(receiver, 1);
  await receiver.deadLetterMessage(m, { deadLetterReason: "audit-failed", deadLetterErrorDescription: "no" });
  ctx.emit({ peekedSubscription: (await receiver.peekMessages(5, { fromSequenceNumber: m.sequenceNumber })).length });
  await receiver.close();
  const dlq = ctx.client.createReceiver(topic, "audit", { subQueueType: "deadLetter" });
  ctx.emit({ peekedDeadLetters: (await dlq.peekMessages(5)).map(ctx.describe) });
  const [dead] = await ctx.receive(dlq, 1);
  ctx.emit({ dead: dead ? ctx.describe(dead) : null });
  if (dead) await dlq.completeMessage(dead);
  await dlq.close();
});

scenario("rules", async (ctx) => {
  // the rule manager (ServiceBusClient.createRuleManager): each subscription its rules, then one send for all
  const topic = ctx.entity();
  const names = ["sql", "corr", "act", "none"];
  const receivers = {};
  for (const name of names) {
    receivers[name] = ctx.client.createReceiver(topic, name);
    await receivers[name].peekMessages(1); // makes the topic and the subscription before the first send
  }
  const managers = {};
  for (const name of names) managers[name] = ctx.client.createRuleManager(topic, name);
  await managers.sql.createRule("red", { sqlExpression: "color = 'red' AND n > 1" });
  await managers.corr.createRule("eu", { correlationId: "order", applicationProperties: { region: "eu" } });
  await managers.act.createRule("tag", { sqlExpression: "n > 1" }, { sqlExpression: "SET tagged = 'yes'" });
  const listed = {};
  for (const name of names) {
    await managers[name].deleteRule("$Default");
    const rules = [];
    for await (const rule of managers[name].listRules()) rules.push(rule);
    listed[name] = rules;
  }
  ctx.emit({ listed });
  const failure = async (call) => {
    try {
      await call();
      return null;
    } catch (err) {
      return { name: err.name, code: err.code };
    }
  };
  ctx.emit({
    deleteUnknown: await failure(() => managers.sql.deleteRule("no-such-rule")),
    createDuplicate: await failure(() => managers.sql.createRule("red", { sqlExpression: "1=1" })),
    createBad: await failure(() => managers.sql.createRule("bad", { sqlExpression: "color = " })),
  });
  const sender = ctx.client.createSender(topic);
  await sender.sendMessages([
    { body: "a", applicationProperties: { color: "red", n: 2 } },
    { body: "b", correlationId: "order", applicationProperties: { region: "eu", n: 1 } },
    { body: "c", correlationId: "order", applicationProperties: { region: "us", color: "red", n: 1 } },
  ]);
  await sender.close();
  const received = {};
  for (const name of names) {
    const got = await ctx.receive(receivers[name], 3, name === "none" ? 300 : 2000);
    for (const m of got) await receivers[name].completeMessage(m);
    received[name] = got.map((m) => ({ body: m.body, applicationProperties: m.applicationProperties }));
    await receivers[name].close();
  }
  ctx.emit({ received });
});

if (require.main === module) {
  run(JSON.parse(process.argv[2])).catch((err) => {
    process.stderr.write(`${err && err.stack}\n`);
    process.exit(1);
  });
}

scenario("sessions", async (ctx) => {
  const queue = ctx.entity();
  const sender = ctx.client.createSender(queue);
  await sender.sendMessages([
    { body: "s1-a", sessionId: "s1" },
    { body: "s2-a", sessionId: "s2" },
    { body: "s1-b", sessionId: "s1" },
  ]);
  await sender.close();
  const s1 = await ctx.client.acceptSession(queue, "s1");
  const got = [];
  while (got.length < 2) {
    const messages = await ctx.receive(s1, 2 - got.length);
    if (messages.length === 0) break;
    for (const m of messages) {
      await s1.completeMessage(m);
      got.push([m.body, m.sessionId]);
    }
  }
  ctx.emit({ s1: got, sessionId: s1.sessionId, locked: s1.sessionLockedUntilUtc instanceof Date });
  await s1.setSessionState({ step: 2 });
  ctx.emit({ state: await s1.getSessionState() });
  const before = s1.sessionLockedUntilUtc.getTime();
  await ctx.step("advance", { seconds: 30 });
  const renewed = await s1.renewSessionLock();
  ctx.emit({ renewedBy: Math.round((renewed.getTime() - before) / 1000) });
  await s1.close();
  const next = await ctx.client.acceptNextSession(queue);
  const [m2] = await ctx.receive(next, 1);
  await next.completeMessage(m2);
  ctx.emit({ next: next.sessionId, body: m2.body });
  await next.close();
  const again = await ctx.client.acceptSession(queue, "s1");
  ctx.emit({ stateAgain: await again.getSessionState(), left: (await ctx.receive(again, 1, 300)).length });
  await again.close();
});

import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { FakeClock, FakeEventSource, FakeLocks, fakeBroadcast, settle } from "./fakes.js";
import { badge, edge, item, store } from "./setup.js";

beforeEach(() => FakeEventSource.reset());

/** Two tabs of user 42 in one browser: a shared lock manager and broadcast channels. */
async function twoTabs() {
  const clock = new FakeClock();
  const state = edge([item("2"), item("1")]);
  const browser = { locks: new FakeLocks(), BroadcastChannel: fakeBroadcast() };
  const first = store(state, clock, browser);
  const second = store(state, clock, browser);
  first.start();
  await settle();
  second.start();
  await settle();
  return { clock, state, first, second, browser };
}

test("two tabs share one connection; the follower gets the leader's events", async () => {
  const { first, second } = await twoTabs();
  assert.equal(FakeEventSource.all.length, 1, "one EventSource for both tabs");
  assert.equal(first.getState().leading, true);
  assert.equal(second.getState().leading, false);
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("snapshot", badge(2, 2), "10");
  source.emit("item_delivered", { message_id: "3", title: "three", category: "news", created_at: "2027-01-15T10:59:00.000Z" }, "11");
  source.emit("badge", badge(3, 3), "12");
  await settle();
  assert.equal(second.getState().status, "live", "the follower shows the leader's status");
  assert.deepEqual(second.getState().badge, badge(3, 3));
  assert.deepEqual(second.getState().items.map((i) => i.message_id), ["3", "2", "1"]);
});

test("a tab that joins late gets the leader's badge and status at once", async () => {
  const clock = new FakeClock();
  const state = edge([]);
  const browser = { locks: new FakeLocks(), BroadcastChannel: fakeBroadcast() };
  const leader = store(state, clock, browser);
  leader.start();
  await settle();
  FakeEventSource.all[0]!.open();
  FakeEventSource.all[0]!.emit("snapshot", badge(5, 4), "20");
  const late = store(state, clock, browser);
  late.start();
  await settle();
  assert.deepEqual(late.getState().badge, badge(5, 4));
  assert.equal(late.getState().status, "live");
  assert.equal(FakeEventSource.all.length, 1);
});

test("when the leader's tab goes, the follower takes the lock and resumes from the last id", async () => {
  const { first, second } = await twoTabs();
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("snapshot", badge(2, 2), "10");
  source.emit("badge", badge(2, 1), "17");
  await settle();
  first.stop();
  await settle();
  assert.equal(source.closed, true, "the leaving tab's stream is closed");
  assert.equal(second.getState().leading, true);
  const resumed = FakeEventSource.all[1]!;
  assert.ok(resumed, "the follower opened a connection");
  assert.equal(resumed.params.get("last_event_id"), "17");
  resumed.open();
  resumed.emit("badge", badge(1, 0), "18");
  assert.deepEqual(second.getState().badge, badge(1, 0));
  assert.equal(FakeEventSource.open().length, 1);
});

test("a follower's own update is applied in that tab at once, and reaches the leader over the stream", async () => {
  const { state, first, second } = await twoTabs();
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("snapshot", badge(2, 2), "10");
  await settle();
  state.fetch.on("POST /v1/items/update", async () => new Response(JSON.stringify({ changed: 1, unknown_message_ids: [], unread: 1, unseen: 1 })));
  await second.archive(["2"]);
  assert.deepEqual(second.getState().items.map((i) => i.message_id), ["1"]);
  assert.deepEqual(second.getState().badge, badge(1, 1));
  assert.deepEqual(first.getState().items.map((i) => i.message_id), ["2", "1"], "the other tab waits for the stream");
  source.emit("item_updated", { message_id: "2", action: "archive", archived: true }, "11");
  source.emit("badge", badge(1, 1), "12");
  await settle();
  assert.deepEqual(first.getState().items.map((i) => i.message_id), ["1"]);
  assert.deepEqual(second.getState().items.map((i) => i.message_id), ["1"], "the echo changes nothing more");
});

test("without Web Locks or BroadcastChannel each tab connects alone", async () => {
  const clock = new FakeClock();
  const state = edge([]);
  const a = store(state, clock, { locks: null, BroadcastChannel: fakeBroadcast() });
  const b = store(state, clock, { locks: new FakeLocks(), BroadcastChannel: null });
  a.start();
  b.start();
  await settle();
  assert.equal(FakeEventSource.all.length, 2);
  assert.equal(a.getState().leading && b.getState().leading, true);
});

test("a heartbeat's id reaches the followers: a tab taking over resumes from it", async () => {
  const { first, second } = await twoTabs();
  const events: string[] = [];
  second.onEvent((event) => events.push(event.name));
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("snapshot", badge(2, 2), "10");
  await settle();
  const before = second.getState();
  source.emit("heartbeat", {}, "25");
  await settle();
  assert.equal(second.getState(), before, "no state changes");
  assert.deepEqual(events, ["snapshot"], "no event for the page");
  first.stop();
  await settle();
  assert.equal(FakeEventSource.all[1]!.params.get("last_event_id"), "25");
});

test("a listener that throws keeps neither the other tabs nor the other listeners from an event; its error is reported", async () => {
  const global = globalThis as { reportError?: (error: unknown) => void };
  const saved = global.reportError;
  const reported: unknown[] = [];
  global.reportError = (error) => reported.push(error);
  try {
    const { first, second } = await twoTabs();
    const calls: string[] = [];
    first.subscribe((state) => {
      if (state.badge) throw new Error("state listener");
    });
    first.onEvent(() => {
      throw new Error("event listener");
    });
    first.onEvent((event) => calls.push(event.name));
    first.onDelivered(() => {
      throw new Error("delivered listener");
    });
    first.onDelivered((i) => calls.push(`delivered ${i.message_id}`));
    const source = FakeEventSource.all[0]!;
    source.open();
    source.emit("snapshot", badge(2, 2), "10");
    source.emit("item_delivered", { message_id: "3", title: "three", category: "news", created_at: "2027-01-15T10:59:00.000Z" }, "11");
    await settle();
    assert.deepEqual(calls, ["snapshot", "delivered 3", "item_delivered"]);
    assert.deepEqual(first.getState().items.map((i) => i.message_id), ["3", "2", "1"]);
    assert.deepEqual(second.getState().badge, badge(2, 2), "the follower got the events");
    assert.deepEqual(second.getState().items.map((i) => i.message_id), ["3", "2", "1"]);
    const messages = new Set(reported.map((error) => (error as Error).message));
    assert.deepEqual([...messages].sort(), ["delivered listener", "event listener", "state listener"]);
  } finally {
    if (saved) global.reportError = saved;
    else delete global.reportError;
  }
});

test("a tab refused the lock (a sandboxed iframe's SecurityError) leads alone", async () => {
  const clock = new FakeClock();
  const state = edge([]);
  const refusing = { request: () => Promise.reject(new DOMException("no locks here", "SecurityError")) };
  const browser = { locks: refusing, BroadcastChannel: fakeBroadcast() };
  const a = store(state, clock, browser);
  const b = store(state, clock, browser);
  a.start();
  b.start();
  await settle();
  assert.equal(FakeEventSource.all.length, 2, "one connection per tab");
  assert.equal(a.getState().leading && b.getState().leading, true);
  FakeEventSource.all[0]!.open();
  FakeEventSource.all[0]!.emit("badge", badge(9, 9), "1");
  await settle();
  assert.equal(b.getState().badge, null, "nothing crosses between them");
});

test("a follower that stops (its lock request aborted) does not lead", async () => {
  const { second } = await twoTabs();
  second.stop();
  await settle();
  assert.equal(second.getState().leading, false);
  assert.equal(FakeEventSource.all.length, 1);
});

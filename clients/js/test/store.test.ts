import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import type { InboxItem } from "../src/types.js";
import { FakeClock, FakeEventSource, json, settle } from "./fakes.js";
import { badge, edge, item, store } from "./setup.js";

beforeEach(() => FakeEventSource.reset());

const ids = (items: readonly InboxItem[]) => items.map((i) => i.message_id);

/** The reconnect delays the clock was asked for (not the refresh's 250 ms nor a page load's 30 s timeout). */
const waits = (clock: FakeClock) => clock.delays.filter((ms) => ms >= 500 && ms < 30_000);

/** A started store with its stream open and its first snapshot applied. */
async function live(items: InboxItem[] = [item("3"), item("2"), item("1")]) {
  const clock = new FakeClock();
  const state = edge(items);
  const s = store(state, clock);
  s.start();
  await settle();
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("snapshot", { ...badge(3, 3), latest: { message_id: "3", title: "title 3", category: "news", created_at: items[0]?.created_at ?? "" } }, "100");
  await settle();
  return { clock, state, s, source };
}

test("the store loads the first page, takes the snapshot's badge and goes live", async () => {
  const { s, source } = await live();
  const now = s.getState();
  assert.deepEqual(ids(now.items), ["3", "2", "1"]);
  assert.deepEqual(now.badge, badge(3, 3));
  assert.equal(now.status, "live");
  assert.equal(now.leading, true, "alone, it holds the connection");
  assert.equal(source.params.has("access_token"), true);
  assert.equal(source.params.has("last_event_id"), false, "a first connection resumes from nothing");
});

test("after a drop it reconnects with backoff and last_event_id = the last id seen", async () => {
  const { clock, s, source } = await live();
  source.emit("item_delivered", { message_id: "4", title: "four", category: "news", created_at: "2027-01-15T10:59:00.000Z" }, "101");
  source.emit("badge", badge(4, 4), "102");
  source.fail();
  assert.equal(source.closed, true, "the SDK closes the EventSource and reconnects itself");
  assert.equal(s.getState().status, "offline");
  assert.equal(s.getState().error?.code, "stream_error");
  assert.equal(FakeEventSource.all.length, 1, "not before the backoff delay");
  await clock.advance(1_000);
  const second = FakeEventSource.all[1]!;
  assert.equal(second.params.get("last_event_id"), "102");
  assert.equal(s.getState().status, "connecting");
  second.open();
  assert.equal(s.getState().status, "live");
  assert.equal(s.getState().error, null);
});

test("repeated failures wait longer each time, and a stream refused before opening takes a new token", async () => {
  const { clock, state, s } = await live();
  const tokensBefore = state.tokens;
  for (let i = 0; i < 4; i++) {
    FakeEventSource.open()[0]!.fail();
    await clock.advance(40_000);
  }
  assert.deepEqual(waits(clock), [750, 1_500, 3_000, 6_000], "equal jitter at random 0.5, doubling");
  assert.ok(state.tokens >= tokensBefore + 3, `a new token for each refused attempt (${state.tokens - tokensBefore})`);
  assert.equal(s.getState().status, "connecting");
});

test("the backoff starts over only after a connection stayed open 30 s: one that opens, sends and drops keeps it growing", async () => {
  const { clock, source } = await live();
  source.emit("badge", badge(3, 2), "101");
  await clock.advance(5_000);
  source.fail();
  for (let i = 0; i < 4; i++) {
    await clock.advance(40_000);
    const next = FakeEventSource.open()[0]!;
    next.open();
    next.emit("badge", badge(3, 2), String(102 + i));
    await clock.advance(5_000);
    next.fail();
  }
  assert.deepEqual(waits(clock), [750, 1_500, 3_000, 6_000, 12_000], "events on a short-lived connection reset nothing");
  await clock.advance(40_000);
  const stable = FakeEventSource.open()[0]!;
  stable.open();
  await clock.advance(30_000);
  stable.fail();
  assert.equal(waits(clock).at(-1), 750, "after 30 s up, the first delay again");
});

test("a 429's Retry-After from the edge holds the reconnect back", async () => {
  const { clock, state, s, source } = await live();
  state.fetch.on("POST /v1/items/update", () => json(429, { error: { code: "rate_limited", message: "slow" } }, { "Retry-After": "20" }));
  await assert.rejects(s.markRead(["1"]));
  source.fail();
  await clock.advance(19_000);
  assert.equal(FakeEventSource.all.length, 1, "still waiting for Retry-After");
  await clock.advance(1_000);
  assert.equal(FakeEventSource.all.length, 2);
});

test("resync drops the list, reloads the first page and takes the badge from the snapshot that follows", async () => {
  const { state, s, source } = await live();
  const loads = state.fetch.count("GET /v1/inbox");
  state.items = [item("9"), item("3")];
  source.emit("resync", { reason: "history" }, "300");
  assert.deepEqual(s.getState().items, [], "dropped at once");
  source.emit("snapshot", { ...badge(7, 5) }, "301");
  await settle();
  assert.equal(state.fetch.count("GET /v1/inbox"), loads + 1);
  assert.deepEqual(ids(s.getState().items), ["9", "3"]);
  assert.deepEqual(s.getState().badge, badge(7, 5));
});

test("duplicate events are applied once", async () => {
  const { s, source } = await live();
  const announced: string[] = [];
  s.onDelivered((i) => announced.push(i.message_id));
  const delivered = { message_id: "4", title: "four", category: "news", created_at: "2027-01-15T10:59:00.000Z" };
  const read = { message_ids: ["2", "4"], action: "mark_read", read: true, seen: true };
  for (let round = 0; round < 2; round++) {
    source.emit("item_delivered", delivered, "101");
    source.emit("item_updated", read, "102");
    source.emit("item_revoked", { message_id: "1" }, "103");
    source.emit("badge", badge(2, 1), "104");
  }
  const items = s.getState().items;
  assert.deepEqual(ids(items), ["4", "3", "2"]);
  assert.deepEqual(items.map((i) => i.read), [true, false, true]);
  assert.deepEqual(announced, ["4"], "announced once");
  assert.deepEqual(s.getState().badge, badge(2, 1));
});

test("a delivered item comes in as a summary, and its body is filled from the first page", async () => {
  const { clock, state, s, source } = await live();
  source.emit("item_delivered", { message_id: "4", title: "four", category: "news", created_at: "2027-01-15T10:59:00.000Z" }, "101");
  assert.equal(s.getState().items[0]?.body, "");
  state.items = [item("4", { title: "four", created_at: "2027-01-15T10:59:00.000Z" }), ...state.items];
  await clock.advance(300);
  assert.equal(s.getState().items[0]?.body, "body 4");
  assert.deepEqual(ids(s.getState().items), ["4", "3", "2", "1"]);
});

test("updates follow the event: by filter, by id, edits, archive leaving the inbox view", async () => {
  const { s, source } = await live();
  source.emit("item_updated", { all: { view: "all", up_to_message_id: "2" }, action: "mark_read", read: true, seen: true });
  assert.deepEqual(s.getState().items.map((i) => [i.message_id, i.read]), [["3", false], ["2", true], ["1", true]]);
  source.emit("item_updated", { message_id: "3", title: "edited", edited_at: "2027-01-15T11:00:00.000Z" });
  assert.equal(s.getState().items[0]?.title, "edited");
  assert.equal(s.getState().items[0]?.edited_at, "2027-01-15T11:00:00.000Z");
  assert.equal(s.getState().items[0]?.read, false, "an edit changes no state");
  source.emit("item_updated", { message_id: "2", action: "archive", archived: true });
  assert.deepEqual(ids(s.getState().items), ["3", "1"]);
  source.emit("item_updated", { message_ids: ["1"], action: "delete", deleted: true });
  assert.deepEqual(ids(s.getState().items), ["3"]);
});

test("an update applies the answer: the items' states and the answered badge, before the stream says so", async () => {
  const { state, s } = await live();
  state.fetch.on("POST /v1/items/update", () => json(200, { changed: 1, unknown_message_ids: [], unread: 2, unseen: 0 }));
  const answer = await s.markRead(["3"]);
  assert.equal(answer.changed, 1);
  assert.deepEqual(state.fetch.calls.at(-1)?.body, { action: "mark_read", message_ids: ["3"] });
  assert.equal(s.getState().items[0]?.read, true);
  assert.deepEqual(s.getState().badge, badge(2, 0));

  state.fetch.on("POST /v1/items/update", () => json(200, { changed: 2, unknown_message_ids: [], unread: 0, unseen: 0 }));
  await s.markAllRead();
  assert.deepEqual(state.fetch.calls.at(-1)?.body, { action: "mark_read", all: { view: "all", up_to_message_id: "3" } }, "up to the newest item known");
  assert.deepEqual(s.getState().items.map((i) => i.read), [true, true, true]);
  assert.deepEqual(s.getState().badge, badge(0, 0));
});

test("events that arrive while a page loads are applied to that page too", async () => {
  const clock = new FakeClock();
  const state = edge([item("2"), item("1")]);
  let answer!: () => void;
  state.fetch.on("GET /v1/inbox", () => new Promise((resolve) => (answer = () => resolve(json(200, { items: [item("2"), item("1")] })))));
  const s = store(state, clock);
  s.start();
  await settle();
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("item_updated", { message_id: "2", action: "mark_read", read: true, seen: true }, "5");
  source.emit("item_delivered", { message_id: "3", title: "three", category: "news", created_at: "2027-01-15T10:59:00.000Z" }, "6");
  answer();
  await settle();
  assert.deepEqual(ids(s.getState().items), ["3", "2", "1"]);
  assert.equal(s.getState().items[1]?.read, true, "the page predates the read; the read wins");
  assert.equal(s.getState().loading, false);
});

test("the unread list and the archive list keep to their filters", async () => {
  const { s, source } = await live([item("3"), item("2", { read: true }), item("1", { archived: true })]);
  await s.setFilter({ view: "inbox", unread_only: true });
  assert.deepEqual(ids(s.getState().items), ["3"]);
  source.emit("item_updated", { message_id: "3", action: "mark_read", read: true, seen: true });
  assert.deepEqual(ids(s.getState().items), [], "read items leave the unread list");
  await s.setFilter({ view: "archive" });
  assert.deepEqual(ids(s.getState().items), ["1"]);
  source.emit("item_delivered", { message_id: "4", title: "four", category: "news", created_at: "2027-01-15T10:59:00.000Z" });
  assert.deepEqual(ids(s.getState().items), ["1"], "a new item is not archived");
});

test("subscribers see the state now and on every change, until they unsubscribe", async () => {
  const { s, source } = await live();
  const seen: (number | undefined)[] = [];
  const stop = s.subscribe((state) => seen.push(state.badge?.unseen));
  source.emit("badge", badge(3, 2));
  stop();
  source.emit("badge", badge(3, 1));
  assert.deepEqual(seen, [3, 2]);
});

test("a fresh stream's snapshot reads the first page again: what changed before the stream started is not lost", async () => {
  const clock = new FakeClock();
  const state = edge([item("2"), item("1")]);
  const s = store(state, clock);
  s.start();
  await settle();
  assert.deepEqual(ids(s.getState().items), ["2", "1"]);
  // Changed after the first read, before the stream started: no event will say so.
  state.items = [item("3"), item("2", { read: true }), item("1")];
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("snapshot", badge(2, 2), "100");
  await settle();
  assert.equal(state.fetch.count("GET /v1/inbox"), 2);
  assert.deepEqual(ids(s.getState().items), ["3", "2", "1"]);
  assert.equal(s.getState().items[1]?.read, true);
});

test("a heartbeat's id is where the next connection resumes; it is no event and changes no state", async () => {
  const { clock, s, source } = await live();
  const events: string[] = [];
  s.onEvent((event) => events.push(event.name));
  const before = s.getState();
  source.emit("heartbeat", {}, "150");
  assert.equal(s.getState(), before);
  assert.deepEqual(events, []);
  source.fail();
  await clock.advance(1_000);
  assert.equal(FakeEventSource.all[1]!.params.get("last_event_id"), "150");
});

test("an update's answer is not applied over stream events that came meanwhile", async () => {
  const { state, s, source } = await live();
  let answer!: () => void;
  state.fetch.on("POST /v1/items/update", () => new Promise((resolve) => (answer = () => resolve(json(200, { changed: 1, unknown_message_ids: [], unread: 2, unseen: 2 })))));
  const pending = s.markRead(["3"]);
  await settle();
  // The stream moves on before the answer: 3 read then unread again on another device, the badge after both.
  source.emit("item_updated", { message_id: "3", action: "mark_read", read: true, seen: true }, "101");
  source.emit("item_updated", { message_id: "3", action: "mark_unread", read: false }, "102");
  source.emit("badge", badge(3, 0), "103");
  answer();
  assert.equal((await pending).unread, 2, "the answer is still the caller's");
  assert.equal(s.getState().items[0]?.read, false);
  assert.deepEqual(s.getState().badge, badge(3, 0));
});

test("an update's answer before any snapshot sets the items' states and makes up no badge", async () => {
  const clock = new FakeClock();
  const state = edge([item("2"), item("1")]);
  state.fetch.on("POST /v1/items/update", () => json(200, { changed: 1, unknown_message_ids: [], unread: 1, unseen: 1 }));
  const s = store(state, clock);
  s.start();
  await settle();
  await s.markRead(["2"]);
  assert.equal(s.getState().items[0]?.read, true);
  assert.equal(s.getState().badge, null);
});

test("stop() and start() while joining make one connection, not two", async () => {
  const clock = new FakeClock();
  const s = store(edge([item("1")]), clock);
  s.start();
  s.stop();
  s.start();
  await settle();
  assert.equal(FakeEventSource.all.length, 1);
  assert.equal(s.getState().leading, true);
});

test("an edit re-reads the first page, for the edited body", async () => {
  const { clock, state, s, source } = await live();
  state.items = [item("3", { title: "edited", body: "edited body" }), item("2"), item("1")];
  source.emit("item_updated", { message_id: "3", title: "edited", edited_at: "2027-01-15T11:00:00.000Z" }, "101");
  assert.equal(s.getState().items[0]?.title, "edited", "the title at once");
  await clock.advance(300);
  assert.equal(s.getState().items[0]?.body, "edited body");
});

test("a page load that never answers fails with timeout after 30 s; loading does not stick", async () => {
  const clock = new FakeClock();
  const state = edge([]);
  state.fetch.on("GET /v1/inbox", () => new Promise<Response>(() => undefined));
  const s = store(state, clock);
  s.start();
  await settle();
  assert.equal(s.getState().loading, true);
  await clock.advance(29_000);
  assert.equal(s.getState().loading, true);
  await clock.advance(1_000);
  assert.equal(s.getState().loading, false);
  assert.equal(s.getState().listError?.code, "timeout");
});

test("the store remembers the last 500 delivered ids it announced", async () => {
  const { s, source } = await live();
  await s.setFilter({ view: "archive" });
  const announced: string[] = [];
  s.onDelivered((i) => announced.push(i.message_id));
  const deliver = (id: number) =>
    source.emit("item_delivered", { message_id: String(id), title: "t", category: "news", created_at: "2027-01-15T10:59:00.000Z" });
  for (let id = 1_000; id <= 1_500; id++) deliver(id);
  assert.equal(announced.length, 501);
  deliver(1_500);
  assert.equal(announced.length, 501, "a recent id is not announced again");
  deliver(1_000);
  assert.equal(announced.length, 502, "the oldest was forgotten");
});

import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { NotifyClient } from "../src/client.js";
import { EventStream } from "../src/stream.js";
import { FakeClock, FakeEventSource, FakeFetch, jwt, settle } from "./fakes.js";

beforeEach(() => FakeEventSource.reset());

function stream(clock: FakeClock) {
  const client = new NotifyClient({ edgeUrl: "https://edge.test", fetch: new FakeFetch().fetch, getToken: async () => jwt({ sub: "42", exp: 4_000_000_000 }) });
  const positions: string[] = [];
  const events = new EventStream({
    client,
    onEvent: () => undefined,
    onStatus: () => undefined,
    onPosition: (id) => positions.push(id),
    EventSource: FakeEventSource,
    timers: clock.timerApi,
    now: () => clock.now,
    backoff: { random: () => 0.5 },
  });
  return { events, positions };
}

test("stop() and start() while the URL is awaited open one EventSource, not two", async () => {
  const { events } = stream(new FakeClock());
  events.start();
  events.stop();
  events.start();
  await settle();
  assert.equal(FakeEventSource.all.length, 1);
});

test("a heartbeat with a new id moves the position and reports it once", async () => {
  const clock = new FakeClock();
  const { events, positions } = stream(clock);
  events.start();
  await settle();
  const source = FakeEventSource.all[0]!;
  source.open();
  source.emit("heartbeat", {}, "7");
  source.emit("heartbeat", {}, "7");
  source.emit("heartbeat", {}, "9");
  assert.deepEqual(positions, ["7", "9"]);
  assert.equal(events.lastEventId, "9");
  source.fail();
  await clock.advance(1_000);
  assert.equal(FakeEventSource.all[1]!.params.get("last_event_id"), "9");
});

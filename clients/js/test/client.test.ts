import assert from "node:assert/strict";
import { test } from "node:test";
import { NotifyClient, parseRetryAfter } from "../src/client.js";
import { NotifyError } from "../src/errors.js";
import { FakeFetch, json, jwt } from "./fakes.js";

function client(fetch: FakeFetch, now = () => 1_800_000_000_000) {
  let issued = 0;
  const client = new NotifyClient({
    edgeUrl: "https://edge.test/",
    fetch: fetch.fetch,
    now,
    getToken: async () => jwt({ sub: "42", exp: 4_000_000_000, n: ++issued }),
  });
  return { client, issued: () => issued };
}

const bearer = (n: number) => `Bearer ${jwt({ sub: "42", exp: 4_000_000_000, n })}`;

test("every call goes to its path with its query, body and the bearer token", async () => {
  const fetch = new FakeFetch()
    .on("GET /v1/inbox", () => json(200, { items: [], next_cursor: "c2" }))
    .on("GET /v1/badge", () => json(200, { unread: 1, unseen: 1, group_unread: 0, group_unread_unknown: false }))
    .on("POST /v1/items/update", () => json(200, { changed: 1, unknown_message_ids: [], unread: 0, unseen: 0 }))
    .on("GET /v1/preferences", () => json(200, { muted_categories: ["a"], muted_group_ids: [] }))
    .on("PUT /v1/preferences", (call) => json(200, call.body))
    .on("GET /v1/groups", () => json(200, { groups: [], total: 0 }))
    .on("GET /v1/groups/7/messages", () => json(200, { messages: [], has_more: false }))
    .on("POST /v1/groups/7/ack", () => json(200, { last_ack_seq: 3 }));
  const { client: c } = client(fetch);
  assert.equal((await c.inbox({ view: "archive", unread_only: true, category: "news", page_size: 5, cursor: "c1" })).next_cursor, "c2");
  assert.equal((await c.badge()).unread, 1);
  await c.updateItems({ action: "archive", all: { view: "all", up_to_message_id: "99" } });
  await c.getPreferences();
  assert.deepEqual(await c.setPreferences({ muted_categories: ["x"], muted_group_ids: ["5"] }), { muted_categories: ["x"], muted_group_ids: ["5"] });
  await c.groups();
  await c.groupMessages("7", { after_seq: 2, limit: 10 });
  assert.equal((await c.ackGroup("7", 3)).last_ack_seq, 3);

  const [inbox, , update, , put, , messages, ack] = fetch.calls;
  assert.equal(inbox!.query.toString(), "view=archive&unread_only=true&category=news&page_size=5&cursor=c1");
  assert.equal(inbox!.headers.Authorization, bearer(1));
  assert.equal(inbox!.headers["Content-Type"], undefined, "no body, no content type");
  assert.deepEqual(update!.body, { action: "archive", all: { view: "all", up_to_message_id: "99" } });
  assert.equal(update!.headers["Content-Type"], "application/json");
  assert.equal(put!.method, "PUT");
  assert.equal(messages!.query.toString(), "after_seq=2&limit=10");
  assert.deepEqual(ack!.body, { seq: 3 });
  assert.equal(fetch.calls.every((call) => call.headers.Authorization === bearer(1)), true, "one token for all");
});

test("a 401 token_expired fetches a fresh token and retries once", async () => {
  const fetch = new FakeFetch().on("GET /v1/badge", (call) =>
    call.headers.Authorization === bearer(1)
      ? json(401, { error: { code: "token_expired", message: "expired" } }, { "WWW-Authenticate": "Bearer" })
      : json(200, { unread: 2, unseen: 1, group_unread: 0, group_unread_unknown: false }),
  );
  const { client: c, issued } = client(fetch);
  assert.equal((await c.badge()).unread, 2);
  assert.equal(issued(), 2);
  assert.deepEqual(fetch.calls.map((call) => call.headers.Authorization), [bearer(1), bearer(2)]);
});

test("a second token_expired is an error, not a loop; other 401s are not retried", async () => {
  const expired = new FakeFetch().on("GET /v1/badge", () => json(401, { error: { code: "token_expired", message: "expired" } }));
  await assert.rejects(client(expired).client.badge(), (e: unknown) => e instanceof NotifyError && e.status === 401 && e.code === "token_expired");
  assert.equal(expired.calls.length, 2);

  const bad = new FakeFetch().on("GET /v1/badge", () => json(401, { error: { code: "token_bad_signature", message: "no" } }));
  const { client: c, issued } = client(bad);
  await assert.rejects(c.badge(), (e: unknown) => e instanceof NotifyError && e.code === "token_bad_signature");
  assert.equal(bad.calls.length, 1);
  assert.equal(issued(), 1);
});

test("errors carry status, code, field, message and Retry-After, and a 429 sets retryNotBefore", async () => {
  const now = 1_800_000_000_000;
  const fetch = new FakeFetch()
    .on("GET /v1/inbox", () => json(400, { error: { code: "invalid_argument", field: "page_size", message: "page_size: must be between 1 and 100" } }))
    .on("GET /v1/badge", () => json(429, { error: { code: "rate_limited", message: "slow down" } }, { "Retry-After": "7" }))
    .on("GET /v1/groups", () => new Response("<html>bad gateway</html>", { status: 502, statusText: "Bad Gateway" }));
  const { client: c } = client(fetch, () => now);
  const invalid = await c.inbox({ page_size: 500 }).catch((e: unknown) => e);
  assert.ok(invalid instanceof NotifyError);
  assert.deepEqual(invalid.toJSON(), { status: 400, code: "invalid_argument", field: "page_size", message: "page_size: must be between 1 and 100", retryAfter: undefined });
  assert.equal(c.retryNotBefore, 0);
  const limited = await c.badge().catch((e: unknown) => e);
  assert.ok(limited instanceof NotifyError);
  assert.equal(limited.status, 429);
  assert.equal(limited.retryAfter, 7);
  assert.equal(c.retryNotBefore, now + 7_000);
  const gateway = await c.groups().catch((e: unknown) => e);
  assert.ok(gateway instanceof NotifyError);
  assert.equal(gateway.code, "http_502");
  assert.equal(gateway.message, "502 Bad Gateway");
});

test("a network failure is a NotifyError with status 0 and code network", async () => {
  const { client: c } = client(new FakeFetch());
  const failing = new NotifyClient({
    edgeUrl: "https://edge.test",
    getToken: async () => jwt({ sub: "42", exp: 4_000_000_000 }),
    fetch: async () => {
      throw new TypeError("Failed to fetch");
    },
  });
  await assert.rejects(failing.badge(), (e: unknown) => e instanceof NotifyError && e.status === 0 && e.code === "network");
  assert.equal(c.edgeUrl, "https://edge.test", "the trailing slash is dropped");
});

test("the events URL carries the token and the resume point", async () => {
  const { client: c } = client(new FakeFetch());
  const fresh = new URL(await c.eventsUrl());
  assert.equal(fresh.pathname, "/v1/events");
  assert.equal(fresh.searchParams.get("access_token"), jwt({ sub: "42", exp: 4_000_000_000, n: 1 }));
  assert.equal(fresh.searchParams.has("last_event_id"), false);
  assert.equal(new URL(await c.eventsUrl("1234")).searchParams.get("last_event_id"), "1234");
});

test("Retry-After reads seconds and HTTP dates", () => {
  const now = Date.parse("2027-01-15T10:00:00Z");
  assert.equal(parseRetryAfter("12", now), 12);
  assert.equal(parseRetryAfter("Fri, 15 Jan 2027 10:00:30 GMT", now), 30);
  assert.equal(parseRetryAfter("soon", now), undefined);
  assert.equal(parseRetryAfter(null, now), undefined);
});

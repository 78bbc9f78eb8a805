/** A store on fakes, with an edge whose inbox and updates the test controls. */
import { NotifyClient } from "../src/client.js";
import { NotifyStore, type StoreOptions } from "../src/store.js";
import type { InboxItem } from "../src/types.js";
import { FakeClock, FakeEventSource, FakeFetch, json, jwt } from "./fakes.js";

export const EDGE = "https://edge.test";

/** An inbox item, unread and in the inbox unless told. */
export function item(id: string, extra: Partial<InboxItem> = {}): InboxItem {
  const minute = Number(id) % 60;
  return {
    message_id: id,
    title: `title ${id}`,
    body: `body ${id}`,
    category: "news",
    data: {},
    created_at: `2027-01-15T10:${String(minute).padStart(2, "0")}:00.000Z`,
    seen: false,
    read: false,
    archived: false,
    ...extra,
  };
}

/** The edge's state: the items its inbox pages answer from, one page only. */
export interface Edge {
  items: InboxItem[];
  fetch: FakeFetch;
  tokens: number;
}

export function edge(items: InboxItem[] = []): Edge {
  const state: Edge = { items, fetch: new FakeFetch(), tokens: 0 };
  state.fetch.on("GET /v1/inbox", (call) => {
    const view = call.query.get("view") ?? "inbox";
    const unreadOnly = call.query.get("unread_only") === "true";
    const listed = state.items
      .filter((i) => (view === "all" ? true : view === "archive" ? i.archived : !i.archived))
      .filter((i) => !unreadOnly || !i.read);
    return json(200, { items: listed });
  });
  return state;
}

/** A store for user 42 on the fake edge; tokens last an hour from the fake clock's now. */
export function store(state: Edge, clock: FakeClock, options: Partial<StoreOptions> = {}): NotifyStore {
  const client = new NotifyClient({
    edgeUrl: EDGE,
    fetch: state.fetch.fetch,
    now: () => clock.now,
    getToken: async () => {
      state.tokens++;
      const now = Math.floor(clock.now / 1000);
      return jwt({ sub: "42", iat: now, exp: now + 3600, n: state.tokens });
    },
  });
  return new NotifyStore({
    client,
    EventSource: FakeEventSource,
    timers: clock.timerApi,
    now: () => clock.now,
    locks: null,
    BroadcastChannel: null,
    backoff: { random: () => 0.5 },
    ...options,
  });
}

/** The badge as the edge sends it. */
export function badge(unread: number, unseen: number) {
  return { unread, unseen, group_unread: 0, group_unread_unknown: false };
}

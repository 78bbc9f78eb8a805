/**
 * The live store: the user's badge and the first pages of one list view,
 * kept exact by the event stream, shared by the user's tabs. It loads the
 * first page, and again once a fresh stream has started (its `snapshot`),
 * so that nothing changed between the two is missed; applies every event
 * to what it holds (idempotently: the stream may repeat events after a
 * reconnect); reloads on `resync`; and applies the answers of its own
 * updates at once, unless the stream has spoken since. One tab holds the
 * connection (`tabs.ts`); the others get its events over a
 * `BroadcastChannel`, and one of them takes over, resuming from the last
 * event id, when it closes.
 */
import { backoffDelay, type BackoffOptions } from "./backoff.js";
import type { NotifyClient } from "./client.js";
import { NotifyError, asNotifyError } from "./errors.js";
import {
  applyUpdate,
  compareIds,
  fromDelivered,
  matches,
  mayEnter,
  newerFirst,
  statesOf,
  targets,
} from "./items.js";
import { EventStream, globalTimers, type EventSourceConstructor, type Timers } from "./stream.js";
import { TabLink, type BroadcastChannelConstructor, type LockManagerLike, type TabMessage } from "./tabs.js";
import type {
  Action,
  Badge,
  Id,
  InboxItem,
  InboxPage,
  InboxQuery,
  ItemFilter,
  ItemUpdatedEvent,
  Status,
  StreamEvent,
  UpdateResponse,
} from "./types.js";

/** Which list the store holds: a view, optionally only unread items or one category. */
export type ListFilter = Pick<ItemFilter, "view" | "unread_only" | "read_only" | "category">;

/** What the store holds, as its subscribers see it. */
export interface StoreState {
  /** The exact badge; null until the stream's first snapshot (or the leader tab's state). */
  badge: Badge | null;
  /** The loaded items of the list, newest first. */
  items: readonly InboxItem[];
  /** The list's filter. */
  filter: ListFilter;
  /** More pages follow the loaded ones. */
  hasMore: boolean;
  /** A page is loading. */
  loading: boolean;
  /** Why the list's last load failed; null when it did not. */
  listError: NotifyError | null;
  /** The connection's state (the leader tab's, in a follower tab). */
  status: Status;
  /** The last error of the connection or of a load; null once live again. */
  error: NotifyError | null;
  /** This tab holds the user's connection. */
  leading: boolean;
}

/** What the store needs; all but `client` have browser defaults. */
export interface StoreOptions {
  client: NotifyClient;
  /** The list to hold (the inbox view). */
  filter?: ListFilter;
  /** Items per page, 1 to 100 (20). */
  pageSize?: number;
  EventSource?: EventSourceConstructor;
  /** `navigator.locks`; null for one connection per tab. */
  locks?: LockManagerLike | null;
  /** `BroadcastChannel`; null for one connection per tab. */
  BroadcastChannel?: BroadcastChannelConstructor | null;
  timers?: Timers;
  backoff?: BackoffOptions;
  now?: () => number;
}

/** Whom an update acts on: listed items, or every item a filter selects. */
export type UpdateTarget = { message_ids: Id[] } | { all: ItemFilter };

/** How long the store gathers changes before re-reading the first page (to fill new items' bodies, or to bring in items an update moved into the view). */
const REFRESH_DELAY_MS = 250;
/** How long a page load may take before it fails (`timeout`), so that `loading` cannot stick on a request that never answers. */
const PAGE_TIMEOUT_MS = 30_000;
/** How many delivered ids the store remembers having announced (a repeat comes soon after, from a resumed stream). */
const ANNOUNCED_MAX = 500;

/**
 * Calls each listener with the value. One that throws neither keeps the
 * others from their call nor breaks the store's work in progress: its
 * error is reported as an uncaught one would be (`reportError`, or thrown
 * from a microtask where there is none).
 */
function notify<T>(listeners: Iterable<(value: T) => void>, value: T): void {
  for (const listener of listeners) {
    try {
      listener(value);
    } catch (error) {
      if (typeof reportError === "function") reportError(error);
      else
        queueMicrotask(() => {
          throw error;
        });
    }
  }
}

/** One user's live inbox. */
export class NotifyStore {
  readonly client: NotifyClient;
  private state: StoreState;
  private readonly listeners = new Set<(state: StoreState) => void>();
  private readonly eventListeners = new Set<(event: StreamEvent) => void>();
  private readonly deliveredListeners = new Set<(item: InboxItem) => void>();
  private readonly options: StoreOptions;
  private readonly timers: Timers;
  private tabs: TabLink | null = null;
  private stream: EventStream | null = null;
  private started = false;
  /** Bumped by start() and stop(): a join() that awaited across them is stale and gives up. */
  private epoch = 0;
  private joinTimer: unknown = null;
  private joinAttempt = 0;
  private refreshTimer: unknown = null;
  /** The id of the last event seen, by this tab's stream or the leader's. */
  private lastEventId = "";
  /** The next page's cursor; undefined on the last. */
  private cursor: string | undefined;
  /** Bumped when the list is dropped: answers of older loads are ignored. */
  private generation = 0;
  /** Counts first-page loads: only the latest one's answer is applied (it read the newest data). */
  private firstPages = 0;
  private moreLoading = false;
  /** Loads in flight, and the item events received meanwhile (replayed on what they answer). */
  private inflight = 0;
  private log: StreamEvent[] = [];
  /** Delivered ids already announced to `onDelivered` (the last `ANNOUNCED_MAX`, oldest first). */
  private readonly announced = new Set<Id>();
  /** Counts the stream's events that change the badge or the items: an update's answer older than one of them is not applied. */
  private changes = 0;
  /** The last event was `resync`: the `snapshot` after it is the resync's, not a fresh stream's. */
  private resynced = false;
  /** The newest message id known (for "mark all" up to what the user saw). */
  private newest: Id | null = null;

  constructor(options: StoreOptions) {
    this.options = options;
    this.client = options.client;
    this.timers = options.timers ?? globalTimers;
    this.state = {
      badge: null,
      items: [],
      filter: options.filter ?? { view: "inbox" },
      hasMore: false,
      loading: false,
      listError: null,
      status: "connecting",
      error: null,
      leading: false,
    };
  }

  /** The current state. */
  getState(): StoreState {
    return this.state;
  }

  /** Calls `listener` with the state now and after every change; returns the unsubscribe. */
  subscribe(listener: (state: StoreState) => void): () => void {
    this.listeners.add(listener);
    listener(this.state);
    return () => this.listeners.delete(listener);
  }

  /** Calls `listener` with every event of the stream (this tab's or the leader's); returns the unsubscribe. */
  onEvent(listener: (event: StreamEvent) => void): () => void {
    this.eventListeners.add(listener);
    return () => this.eventListeners.delete(listener);
  }

  /** Calls `listener` once per newly delivered item (not again when the stream repeats it); returns the unsubscribe. */
  onDelivered(listener: (item: InboxItem) => void): () => void {
    this.deliveredListeners.add(listener);
    return () => this.deliveredListeners.delete(listener);
  }

  /** Connects (or joins the tab holding the connection) and loads the first page. */
  start(): void {
    if (this.started) return;
    this.started = true;
    this.epoch++;
    void this.loadFirstPage(false);
    void this.join();
  }

  /** Disconnects; another tab takes the connection over if this one held it. */
  stop(): void {
    this.started = false;
    this.epoch++;
    this.stream?.stop();
    this.stream = null;
    this.tabs?.stop();
    this.tabs = null;
    for (const timer of [this.joinTimer, this.refreshTimer]) if (timer !== null) this.timers.clearTimeout(timer);
    this.joinTimer = this.refreshTimer = null;
    this.set({ leading: false });
  }

  /** Shows another list: drops the items and loads its first page. */
  setFilter(filter: ListFilter): Promise<void> {
    this.set({ filter });
    return this.loadFirstPage(false);
  }

  /** Drops the items and loads the first page again. */
  reload(): Promise<void> {
    return this.loadFirstPage(false);
  }

  /** Appends the next page, if there is one and none is loading. */
  async loadMore(): Promise<void> {
    const cursor = this.cursor;
    if (cursor === undefined || this.moreLoading) return;
    const generation = this.generation;
    this.moreLoading = true;
    const mark = this.beginFetch();
    try {
      const page = await this.page({ ...this.query(), cursor });
      if (generation !== this.generation || cursor !== this.cursor) return;
      const known = new Set(this.state.items.map((item) => item.message_id));
      this.cursor = page.next_cursor ?? undefined;
      const items = this.replay(mark, [...this.state.items, ...page.items.filter((item) => !known.has(item.message_id))]);
      this.set({ items, hasMore: this.cursor !== undefined, listError: null });
    } catch (error) {
      if (generation === this.generation) this.failLoad(error);
    } finally {
      this.moreLoading = false;
      this.endFetch();
    }
  }

  /**
   * `POST /v1/items/update`, applied here as soon as the edge answers: the
   * items' new states and the answered `unread` and `unseen` (onto a badge
   * the store has; none is made up before the first snapshot). Unless an
   * event that changes the badge or the items came in the meantime: the
   * answer may then be older than what the store holds, and the stream,
   * which brings this change to every tab and device too, has the last
   * word.
   */
  async update(action: Action, target: UpdateTarget): Promise<UpdateResponse> {
    const changes = this.changes;
    const answer = await this.client.updateItems({ action, ...target });
    if (changes !== this.changes) return answer;
    this.applyItemEvent({ name: "item_updated", data: { action, ...target } as ItemUpdatedEvent, id: "" });
    const badge = this.state.badge;
    if (badge) this.setBadge({ ...badge, unread: answer.unread, unseen: answer.unseen });
    return answer;
  }

  /** Marks the items read. */
  markRead(ids: Id[]): Promise<UpdateResponse> {
    return this.update("mark_read", { message_ids: ids });
  }

  /** Marks the items unread. */
  markUnread(ids: Id[]): Promise<UpdateResponse> {
    return this.update("mark_unread", { message_ids: ids });
  }

  /** Archives the items. */
  archive(ids: Id[]): Promise<UpdateResponse> {
    return this.update("archive", { message_ids: ids });
  }

  /** Brings the items back to the inbox. */
  unarchive(ids: Id[]): Promise<UpdateResponse> {
    return this.update("unarchive", { message_ids: ids });
  }

  /** Deletes the items for this user, for good. */
  delete(ids: Id[]): Promise<UpdateResponse> {
    return this.update("delete", { message_ids: ids });
  }

  /** Marks every item read, up to the newest the store knows of (not one delivered since). */
  markAllRead(): Promise<UpdateResponse> {
    return this.update("mark_read", { all: this.everything() });
  }

  /** Marks every item seen (the bell's number goes to 0), up to the newest the store knows of. */
  markAllSeen(): Promise<UpdateResponse> {
    return this.update("mark_seen", { all: this.everything() });
  }

  private everything(): ItemFilter {
    return this.newest ? { view: "all", up_to_message_id: this.newest } : { view: "all" };
  }

  private query(): InboxQuery {
    const { view, unread_only, read_only, category } = this.state.filter;
    return { view, unread_only, read_only, category: category ?? undefined, page_size: this.options.pageSize };
  }

  private set(change: Partial<StoreState>): void {
    this.state = { ...this.state, ...change };
    notify(this.listeners, this.state);
  }

  private setBadge(badge: Badge): void {
    const old = this.state.badge;
    const same =
      old &&
      old.unread === badge.unread &&
      old.unseen === badge.unseen &&
      old.group_unread === badge.group_unread &&
      old.group_unread_unknown === badge.group_unread_unknown;
    if (!same) this.set({ badge });
  }

  private noteNewest(id: Id | null | undefined): void {
    if (id && (!this.newest || compareIds(id, this.newest) > 0)) this.newest = id;
  }

  /** Finds the user (the token's `sub`) and joins their tabs, retrying while the token provider fails. */
  private async join(): Promise<void> {
    const epoch = this.epoch;
    this.joinTimer = null;
    let userId: string;
    try {
      userId = await this.client.userId();
    } catch (error) {
      if (epoch !== this.epoch) return;
      this.set({ status: "offline", error: asNotifyError(error, "token_provider") });
      this.joinTimer = this.timers.setTimeout(() => void this.join(), backoffDelay(this.joinAttempt++, this.options.backoff));
      return;
    }
    if (epoch !== this.epoch) return;
    const { locks = globalThis.navigator?.locks, BroadcastChannel = globalThis.BroadcastChannel } = this.options;
    this.tabs = new TabLink(
      `notify-inbox:${this.client.edgeUrl}:${userId}`,
      { lead: () => this.lead(), receive: (message) => this.fromTab(message) },
      locks,
      BroadcastChannel,
    );
    this.tabs.start();
  }

  /** This tab holds the lock: opens the stream where the last leader left off. */
  private lead(): void {
    this.set({ leading: true });
    this.stream = new EventStream({
      client: this.client,
      lastEventId: this.lastEventId,
      EventSource: this.options.EventSource,
      timers: this.timers,
      backoff: this.options.backoff,
      now: this.options.now,
      // The other tabs first: nothing this tab's listeners do can keep the event from them.
      onEvent: (event) => {
        this.tabs?.post({ kind: "event", event });
        this.receive(event);
      },
      onPosition: (lastEventId) => {
        this.lastEventId = lastEventId;
        this.tabs?.post({ kind: "position", lastEventId });
      },
      onStatus: (status, error) => {
        this.set({ status, error: status === "live" ? null : (error ?? this.state.error) });
        this.tabs?.post({ kind: "status", status, error: error?.toJSON() ?? null });
      },
    });
    this.stream.start();
  }

  private fromTab(message: TabMessage): void {
    switch (message.kind) {
      case "event":
        this.receive(message.event);
        break;
      case "position":
        if (!this.state.leading) this.lastEventId = message.lastEventId;
        break;
      case "status":
        if (!this.state.leading) this.set({ status: message.status, error: message.error && NotifyError.from(message.error) });
        break;
      case "hello":
        if (this.state.leading) {
          const { badge, status, error } = this.state;
          this.tabs?.post({ kind: "state", badge, status, error: error?.toJSON() ?? null, lastEventId: this.lastEventId });
        }
        break;
      case "state":
        if (this.state.leading) break;
        if (message.lastEventId) this.lastEventId = message.lastEventId;
        if (message.badge) this.setBadge(message.badge);
        this.set({ status: message.status, error: message.error && NotifyError.from(message.error) });
        break;
    }
  }

  /** An event of the stream, from this tab's connection or the leader's. */
  private receive(event: StreamEvent): void {
    if (event.id) this.lastEventId = event.id;
    if (event.name !== "group_message") this.changes++;
    const resynced = this.resynced;
    this.resynced = event.name === "resync";
    switch (event.name) {
      case "snapshot": {
        const { latest, ...badge } = event.data;
        this.noteNewest(latest?.message_id);
        this.setBadge(badge);
        // A fresh stream (no resume): the first page was read before it
        // started, and what changed in between comes as no event. Read it
        // again. (After a resync, the resync's reload is under way.)
        if (!resynced) void this.loadFirstPage(true);
        break;
      }
      case "badge":
        this.setBadge(event.data);
        break;
      case "resync":
        void this.loadFirstPage(false);
        break;
      case "group_message":
        break;
      default:
        this.applyItemEvent(event);
    }
    notify(this.eventListeners, event);
  }

  /** Applies an item event to the list now, and to what loads in flight will answer. */
  private applyItemEvent(event: StreamEvent): void {
    if (this.inflight > 0) this.log.push(event);
    const before = this.state.items;
    const items = this.applyTo(event, before);
    if (items !== before) this.set({ items });
    if (event.name === "item_delivered" && !this.announced.has(event.data.message_id)) {
      this.announced.add(event.data.message_id);
      if (this.announced.size > ANNOUNCED_MAX) this.announced.delete(this.announced.values().next().value!);
      if (!before.some((item) => item.message_id === event.data.message_id)) {
        const item = items.find((i) => i.message_id === event.data.message_id) ?? fromDelivered(event.data);
        notify(this.deliveredListeners, item);
      }
    }
  }

  /** The list after an item event (the same list when nothing changes). */
  private applyTo(event: StreamEvent, items: readonly InboxItem[]): readonly InboxItem[] {
    const filter = this.state.filter;
    switch (event.name) {
      case "item_delivered": {
        const item = fromDelivered(event.data);
        this.noteNewest(item.message_id);
        if (items.some((i) => i.message_id === item.message_id) || !matches(item, filter)) return items;
        const last = items[items.length - 1];
        // Older than the loaded pages while more follow: it belongs to a later page.
        if (this.cursor !== undefined && last && newerFirst(item, last) > 0) return items;
        this.scheduleRefresh();
        return [...items, item].sort(newerFirst);
      }
      case "item_revoked": {
        const kept = items.filter((i) => i.message_id !== event.data.message_id);
        return kept.length === items.length ? items : kept;
      }
      case "item_updated": {
        const update = event.data;
        const states = statesOf(update);
        if (mayEnter(states, filter)) this.scheduleRefresh();
        let changed = false;
        const next: InboxItem[] = [];
        for (const item of items) {
          if (!targets(update, item)) {
            next.push(item);
            continue;
          }
          const after = applyUpdate(item, update, states);
          changed = true;
          if (after && matches(after, filter)) next.push(after);
        }
        // An edit of a listed item: the event has its new title, not its new body.
        if (changed && update.edited_at) this.scheduleRefresh();
        return changed ? next : items;
      }
      default:
        return items;
    }
  }

  /**
   * Loads the first page. `keepTail: false` drops the list first (a new
   * view, a resync); `true` replaces only the first page's span and keeps
   * the further pages loaded. Item events that arrive while it loads are
   * applied again to its answer, which may predate them.
   */
  private async loadFirstPage(keepTail: boolean): Promise<void> {
    if (!keepTail) {
      this.generation++;
      this.cursor = undefined;
      this.set({ items: [], hasMore: false, listError: null });
    }
    const generation = this.generation;
    const load = ++this.firstPages;
    const mark = this.beginFetch();
    try {
      const page = await this.page(this.query());
      if (generation !== this.generation || load !== this.firstPages) return;
      let items = page.items;
      let cursor = page.next_cursor ?? undefined;
      const last = page.items[page.items.length - 1];
      if (keepTail && cursor !== undefined && last) {
        const listed = new Set(page.items.map((item) => item.message_id));
        const tail = this.state.items.filter((item) => !listed.has(item.message_id) && newerFirst(item, last) > 0);
        if (tail.length > 0) {
          items = [...page.items, ...tail];
          cursor = this.cursor;
        }
      }
      this.noteNewest(page.items[0]?.message_id);
      this.cursor = cursor;
      this.set({ items: this.replay(mark, items), hasMore: cursor !== undefined, listError: null });
    } catch (error) {
      if (generation === this.generation && load === this.firstPages) this.failLoad(error);
    } finally {
      this.endFetch();
    }
  }

  /** `GET /v1/inbox`, failing with `timeout` (and the request aborted) when no answer comes in time. */
  private page(query: InboxQuery): Promise<InboxPage> {
    return new Promise((resolve, reject) => {
      const abort = new AbortController();
      const timer = this.timers.setTimeout(() => {
        const error = new NotifyError(0, "timeout", `no answer to the page load in ${PAGE_TIMEOUT_MS / 1000} s`);
        abort.abort(error);
        reject(error);
      }, PAGE_TIMEOUT_MS);
      this.client.inbox(query, abort.signal).then(resolve, reject).finally(() => this.timers.clearTimeout(timer));
    });
  }

  private failLoad(error: unknown): void {
    const failure = asNotifyError(error, "network");
    this.set({ listError: failure, error: failure });
  }

  /** Re-reads the first page soon (once for a burst of changes). */
  private scheduleRefresh(): void {
    if (this.refreshTimer !== null || !this.started) return;
    this.refreshTimer = this.timers.setTimeout(() => {
      this.refreshTimer = null;
      void this.loadFirstPage(true);
    }, REFRESH_DELAY_MS);
  }

  private beginFetch(): number {
    this.inflight++;
    if (!this.state.loading) this.set({ loading: true });
    return this.log.length;
  }

  private endFetch(): void {
    this.inflight--;
    if (this.inflight === 0) {
      this.log = [];
      this.set({ loading: false });
    }
  }

  /** The item events logged since `mark`, applied to a load's answer. */
  private replay(mark: number, items: readonly InboxItem[]): readonly InboxItem[] {
    let result = items;
    for (const event of this.log.slice(mark)) result = this.applyTo(event, result);
    return result;
  }
}

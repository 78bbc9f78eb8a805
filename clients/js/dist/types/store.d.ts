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
import { type BackoffOptions } from "./backoff.js";
import type { NotifyClient } from "./client.js";
import { NotifyError } from "./errors.js";
import { type EventSourceConstructor, type Timers } from "./stream.js";
import { type BroadcastChannelConstructor, type LockManagerLike } from "./tabs.js";
import type { Action, Badge, Id, InboxItem, ItemFilter, Status, StreamEvent, UpdateResponse } from "./types.js";
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
export type UpdateTarget = {
    message_ids: Id[];
} | {
    all: ItemFilter;
};
/** One user's live inbox. */
export declare class NotifyStore {
    readonly client: NotifyClient;
    private state;
    private readonly listeners;
    private readonly eventListeners;
    private readonly deliveredListeners;
    private readonly options;
    private readonly timers;
    private tabs;
    private stream;
    private started;
    /** Bumped by start() and stop(): a join() that awaited across them is stale and gives up. */
    private epoch;
    private joinTimer;
    private joinAttempt;
    private refreshTimer;
    /** The id of the last event seen, by this tab's stream or the leader's. */
    private lastEventId;
    /** The next page's cursor; undefined on the last. */
    private cursor;
    /** Bumped when the list is dropped: answers of older loads are ignored. */
    private generation;
    /** Counts first-page loads: only the latest one's answer is applied (it read the newest data). */
    private firstPages;
    private moreLoading;
    /** Loads in flight, and the item events received meanwhile (replayed on what they answer). */
    private inflight;
    private log;
    /** Delivered ids already announced to `onDelivered` (the last `ANNOUNCED_MAX`, oldest first). */
    private readonly announced;
    /** Counts the stream's events that change the badge or the items: an update's answer older than one of them is not applied. */
    private changes;
    /** The last event was `resync`: the `snapshot` after it is the resync's, not a fresh stream's. */
    private resynced;
    /** The newest message id known (for "mark all" up to what the user saw). */
    private newest;
    constructor(options: StoreOptions);
    /** The current state. */
    getState(): StoreState;
    /** Calls `listener` with the state now and after every change; returns the unsubscribe. */
    subscribe(listener: (state: StoreState) => void): () => void;
    /** Calls `listener` with every event of the stream (this tab's or the leader's); returns the unsubscribe. */
    onEvent(listener: (event: StreamEvent) => void): () => void;
    /** Calls `listener` once per newly delivered item (not again when the stream repeats it); returns the unsubscribe. */
    onDelivered(listener: (item: InboxItem) => void): () => void;
    /** Connects (or joins the tab holding the connection) and loads the first page. */
    start(): void;
    /** Disconnects; another tab takes the connection over if this one held it. */
    stop(): void;
    /** Shows another list: drops the items and loads its first page. */
    setFilter(filter: ListFilter): Promise<void>;
    /** Drops the items and loads the first page again. */
    reload(): Promise<void>;
    /** Appends the next page, if there is one and none is loading. */
    loadMore(): Promise<void>;
    /**
     * `POST /v1/items/update`, applied here as soon as the edge answers: the
     * items' new states and the answered `unread` and `unseen` (onto a badge
     * the store has; none is made up before the first snapshot). Unless an
     * event that changes the badge or the items came in the meantime: the
     * answer may then be older than what the store holds, and the stream,
     * which brings this change to every tab and device too, has the last
     * word.
     */
    update(action: Action, target: UpdateTarget): Promise<UpdateResponse>;
    /** Marks the items read. */
    markRead(ids: Id[]): Promise<UpdateResponse>;
    /** Marks the items unread. */
    markUnread(ids: Id[]): Promise<UpdateResponse>;
    /** Archives the items. */
    archive(ids: Id[]): Promise<UpdateResponse>;
    /** Brings the items back to the inbox. */
    unarchive(ids: Id[]): Promise<UpdateResponse>;
    /** Deletes the items for this user, for good. */
    delete(ids: Id[]): Promise<UpdateResponse>;
    /** Marks every item read, up to the newest the store knows of (not one delivered since). */
    markAllRead(): Promise<UpdateResponse>;
    /** Marks every item seen (the bell's number goes to 0), up to the newest the store knows of. */
    markAllSeen(): Promise<UpdateResponse>;
    private everything;
    private query;
    private set;
    private setBadge;
    private noteNewest;
    /** Finds the user (the token's `sub`) and joins their tabs, retrying while the token provider fails. */
    private join;
    /** This tab holds the lock: opens the stream where the last leader left off. */
    private lead;
    private fromTab;
    /** An event of the stream, from this tab's connection or the leader's. */
    private receive;
    /** Applies an item event to the list now, and to what loads in flight will answer. */
    private applyItemEvent;
    /** The list after an item event (the same list when nothing changes). */
    private applyTo;
    /**
     * Loads the first page. `keepTail: false` drops the list first (a new
     * view, a resync); `true` replaces only the first page's span and keeps
     * the further pages loaded. Item events that arrive while it loads are
     * applied again to its answer, which may predate them.
     */
    private loadFirstPage;
    /** `GET /v1/inbox`, failing with `timeout` (and the request aborted) when no answer comes in time. */
    private page;
    private failLoad;
    /** Re-reads the first page soon (once for a burst of changes). */
    private scheduleRefresh;
    private beginFetch;
    private endFetch;
    /** The item events logged since `mark`, applied to a load's answer. */
    private replay;
}

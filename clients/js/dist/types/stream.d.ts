/**
 * The live stream: an `EventSource` on `GET /v1/events` that this module
 * reopens itself, rather than leaving it to the browser, so that every
 * reconnect carries a fresh token and the last position seen
 * (`last_event_id`: an event's id, or a heartbeat's), and waits a
 * jittered, growing delay (and any `Retry-After` the edge gave) in
 * between. The delay starts over only after a connection that stayed open
 * a while, so an edge that accepts and drops at once is not hammered.
 */
import { type BackoffOptions } from "./backoff.js";
import type { NotifyClient } from "./client.js";
import { NotifyError } from "./errors.js";
import type { Status, StreamEvent, StreamEventName } from "./types.js";
/** The part of `EventSource` the stream uses (a test passes a fake). */
export interface EventSourceLike {
    addEventListener(type: string, listener: (event: MessageEvent) => void): void;
    onopen: ((event: Event) => void) | null;
    onerror: ((event: Event) => void) | null;
    close(): void;
}
/** A constructor of `EventSource`s. */
export type EventSourceConstructor = new (url: string) => EventSourceLike;
/** `setTimeout` and `clearTimeout` (a test passes fakes). */
export interface Timers {
    setTimeout(callback: () => void, ms: number): unknown;
    clearTimeout(handle: unknown): void;
}
/** The global timers. */
export declare const globalTimers: Timers;
/** Every event the edge sends. */
export declare const EVENT_NAMES: readonly StreamEventName[];
/** What the stream needs and whom it tells. */
export interface EventStreamOptions {
    client: NotifyClient;
    /** Called with each event, in order (not with heartbeats: they are no event of the inbox). */
    onEvent(event: StreamEvent): void;
    /**
     * Called when a heartbeat moves the resume position (its id) with no
     * event: the stream has every event up to it, so a reconnect, here or in
     * the tab taking over, may resume from there.
     */
    onPosition?(lastEventId: string): void;
    /** Called when the connection's state changes, with the error that took it down. */
    onStatus(status: Status, error: NotifyError | null): void;
    /** Where to resume: the last id a previous connection (or another tab) saw. */
    lastEventId?: string;
    EventSource?: EventSourceConstructor;
    timers?: Timers;
    backoff?: BackoffOptions;
    now?: () => number;
}
/** One user's live stream, reconnecting until stopped. */
export declare class EventStream {
    private readonly options;
    /** The id of the last event or heartbeat received (what the next connection resumes after). */
    lastEventId: string;
    private source;
    private timer;
    private attempt;
    private running;
    /** Bumped by start() and stop(): a connect() that awaited across them is stale and gives up. */
    private epoch;
    private readonly EventSourceImpl;
    private readonly timers;
    private readonly now;
    constructor(options: EventStreamOptions);
    /** Opens the stream (and keeps it open). */
    start(): void;
    /** Closes it, and stops reconnecting. */
    stop(): void;
    private connect;
    /** Schedules the next connection after the backoff delay, or the edge's `Retry-After` if later. */
    private retry;
}

/**
 * The live stream: an `EventSource` on `GET /v1/events` that this module
 * reopens itself, rather than leaving it to the browser, so that every
 * reconnect carries a fresh token and the last position seen
 * (`last_event_id`: an event's id, or a heartbeat's), and waits a
 * jittered, growing delay (and any `Retry-After` the edge gave) in
 * between. The delay starts over only after a connection that stayed open
 * a while, so an edge that accepts and drops at once is not hammered.
 */
import { backoffDelay, type BackoffOptions } from "./backoff.js";
import type { NotifyClient } from "./client.js";
import { NotifyError, asNotifyError } from "./errors.js";
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
export const globalTimers: Timers = {
  setTimeout: (callback, ms) => globalThis.setTimeout(callback, ms),
  clearTimeout: (handle) => globalThis.clearTimeout(handle as ReturnType<typeof setTimeout>),
};

/** Every event the edge sends. */
export const EVENT_NAMES: readonly StreamEventName[] = [
  "snapshot",
  "badge",
  "item_delivered",
  "item_updated",
  "item_revoked",
  "group_message",
  "resync",
];

/** How long a connection must stay open for the backoff to start over when it drops. */
const STABLE_MS = 30_000;

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
export class EventStream {
  /** The id of the last event or heartbeat received (what the next connection resumes after). */
  lastEventId: string;
  private source: EventSourceLike | null = null;
  private timer: unknown = null;
  private attempt = 0;
  private running = false;
  /** Bumped by start() and stop(): a connect() that awaited across them is stale and gives up. */
  private epoch = 0;
  private readonly EventSourceImpl: EventSourceConstructor;
  private readonly timers: Timers;
  private readonly now: () => number;

  constructor(private readonly options: EventStreamOptions) {
    this.lastEventId = options.lastEventId ?? "";
    this.EventSourceImpl = options.EventSource ?? (globalThis.EventSource as unknown as EventSourceConstructor);
    this.timers = options.timers ?? globalTimers;
    this.now = options.now ?? Date.now;
  }

  /** Opens the stream (and keeps it open). */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.epoch++;
    void this.connect();
  }

  /** Closes it, and stops reconnecting. */
  stop(): void {
    this.running = false;
    this.epoch++;
    this.source?.close();
    this.source = null;
    if (this.timer !== null) this.timers.clearTimeout(this.timer);
    this.timer = null;
  }

  private async connect(): Promise<void> {
    const epoch = this.epoch;
    this.timer = null;
    this.options.onStatus("connecting", null);
    let url: string;
    try {
      url = await this.options.client.eventsUrl(this.lastEventId);
    } catch (error) {
      if (epoch === this.epoch) this.retry(asNotifyError(error, "token_provider"));
      return;
    }
    if (epoch !== this.epoch) return;
    const source = new this.EventSourceImpl(url);
    this.source = source;
    let opened = false;
    let openedAt = 0;
    source.onopen = () => {
      opened = true;
      openedAt = this.now();
      this.options.onStatus("live", null);
    };
    source.onerror = () => {
      source.close();
      if (this.source !== source) return;
      this.source = null;
      // Refused before it opened: most likely the token (401) or a rate
      // limit (429), which an EventSource does not let us read; the next
      // attempt takes a new token.
      if (!opened) this.options.client.tokens.invalidate();
      // Up long enough to count as a recovery: the delays start over. A
      // connection dropped sooner keeps them growing.
      else if (this.now() - openedAt >= STABLE_MS) this.attempt = 0;
      this.retry(new NotifyError(0, "stream_error", opened ? "the event stream dropped" : "the event stream could not open"));
    };
    for (const name of EVENT_NAMES) {
      source.addEventListener(name, (message) => {
        if (this.source !== source) return;
        if (message.lastEventId) this.lastEventId = message.lastEventId;
        let data: unknown;
        try {
          data = JSON.parse(message.data as string);
        } catch {
          return;
        }
        this.options.onEvent({ name, data, id: message.lastEventId } as StreamEvent);
      });
    }
    // `event: heartbeat` with an id (a heartbeat without one is an SSE comment, which no listener sees).
    source.addEventListener("heartbeat", (message) => {
      if (this.source !== source || !message.lastEventId || message.lastEventId === this.lastEventId) return;
      this.lastEventId = message.lastEventId;
      this.options.onPosition?.(message.lastEventId);
    });
  }

  /** Schedules the next connection after the backoff delay, or the edge's `Retry-After` if later. */
  private retry(error: NotifyError): void {
    if (!this.running) return;
    this.options.onStatus("offline", error);
    const wait = Math.max(
      backoffDelay(this.attempt++, this.options.backoff),
      this.options.client.retryNotBefore - this.now(),
    );
    this.timer = this.timers.setTimeout(() => void this.connect(), wait);
  }
}

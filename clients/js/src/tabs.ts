/**
 * One connection for all the tabs of one user: the tabs elect a leader
 * with the Web Locks API (the lock is held while the leader's tab lives,
 * and passes to a waiting tab when it closes), and the leader fans its
 * stream out to the others over a `BroadcastChannel`. Without either API,
 * or when the page may not take locks (a sandboxed iframe's
 * `SecurityError`), every tab leads alone.
 */
import type { NotifyErrorFields } from "./errors.js";
import type { Badge, Status, StreamEvent } from "./types.js";

/** The part of `navigator.locks` used. */
export interface LockManagerLike {
  request(name: string, options: { signal?: AbortSignal }, callback: () => Promise<void>): Promise<unknown>;
}

/** The part of `BroadcastChannel` used. */
export interface BroadcastChannelLike {
  postMessage(message: unknown): void;
  onmessage: ((event: MessageEvent) => void) | null;
  close(): void;
}

/** A constructor of `BroadcastChannel`s. */
export type BroadcastChannelConstructor = new (name: string) => BroadcastChannelLike;

/** What the tabs tell each other. */
export type TabMessage =
  /** The leader's stream sent an event. */
  | { kind: "event"; event: StreamEvent }
  /** A heartbeat moved the leader's resume position (what a tab taking over resumes from). */
  | { kind: "position"; lastEventId: string }
  /** The leader's connection changed state. */
  | { kind: "status"; status: Status; error: NotifyErrorFields | null }
  /** A new tab asks the leader for its state. */
  | { kind: "hello" }
  /** The leader's answer to `hello`. */
  | { kind: "state"; badge: Badge | null; status: Status; error: NotifyErrorFields | null; lastEventId: string };

/** What a tab does as leader or follower. */
export interface TabHandlers {
  /** This tab now holds the lock: open the stream. */
  lead(): void;
  /** A message from another tab. */
  receive(message: TabMessage): void;
}

/** This tab's place among the user's tabs. */
export class TabLink {
  /** Whether this tab holds the connection. */
  leading = false;
  private channel: BroadcastChannelLike | null = null;
  private abort: AbortController | null = null;
  private release: (() => void) | null = null;

  constructor(
    private readonly name: string,
    private readonly handlers: TabHandlers,
    private readonly locks: LockManagerLike | null | undefined,
    private readonly BroadcastChannelImpl: BroadcastChannelConstructor | null | undefined,
  ) {}

  /** Joins the tabs: leads now when alone, else waits for the lock and follows meanwhile. */
  start(): void {
    if (!this.locks || !this.BroadcastChannelImpl) {
      this.becomeLeader();
      return;
    }
    const channel = new this.BroadcastChannelImpl(this.name);
    this.channel = channel;
    channel.onmessage = (event) => this.handlers.receive(event.data as TabMessage);
    const abort = new AbortController();
    this.abort = abort;
    this.locks
      .request(this.name, { signal: abort.signal }, () => {
        if (abort.signal.aborted) return Promise.resolve();
        this.becomeLeader();
        return new Promise<void>((resolve) => (this.release = resolve));
      })
      .catch((error: unknown) => {
        // Aborted by stop(): nothing to do. Refused otherwise (a sandboxed
        // iframe's SecurityError): no lock can be had, so lead alone, with
        // a connection of this tab's own, and tell the other tabs nothing.
        if (abort.signal.aborted || (error as Error | null)?.name === "AbortError" || this.abort !== abort) return;
        this.channel?.close();
        this.channel = null;
        this.becomeLeader();
      });
    channel.postMessage({ kind: "hello" } satisfies TabMessage);
  }

  /** Tells the other tabs (none when alone). */
  post(message: TabMessage): void {
    this.channel?.postMessage(message);
  }

  /** Leaves: gives the lock up (another tab takes over) or stops waiting for it. */
  stop(): void {
    this.abort?.abort();
    this.release?.();
    this.channel?.close();
    this.channel = null;
    this.abort = null;
    this.release = null;
    this.leading = false;
  }

  private becomeLeader(): void {
    this.leading = true;
    this.handlers.lead();
  }
}

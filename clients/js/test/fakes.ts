/**
 * Fakes of the browser APIs the store uses (EventSource, fetch, timers,
 * Web Locks, BroadcastChannel), driven step by step by the tests.
 */
import type { EventSourceLike } from "../src/stream.js";
import type { BroadcastChannelLike, LockManagerLike } from "../src/tabs.js";

/** A JWT (unsigned: the client never verifies) with the claims given. */
export function jwt(claims: Record<string, unknown>): string {
  const part = (value: unknown) => Buffer.from(JSON.stringify(value)).toString("base64url");
  return `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}.c2lnbmF0dXJl`;
}

/** Timers on a clock that moves only when told. */
export class FakeClock {
  now = 1_800_000_000_000;
  private timers: { at: number; callback: () => void; id: number }[] = [];
  private next = 1;
  /** Delays asked for, in order. */
  readonly delays: number[] = [];

  readonly timerApi = {
    setTimeout: (callback: () => void, ms: number): unknown => {
      const id = this.next++;
      this.delays.push(ms);
      this.timers.push({ at: this.now + ms, callback, id });
      return id;
    },
    clearTimeout: (id: unknown): void => {
      this.timers = this.timers.filter((timer) => timer.id !== id);
    },
  };

  /** Moves the clock, running the timers that come due, then lets promises settle. */
  async advance(ms: number): Promise<void> {
    const end = this.now + ms;
    for (;;) {
      const due = this.timers.filter((timer) => timer.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((timer) => timer !== due);
      this.now = due.at;
      due.callback();
      await settle();
    }
    this.now = end;
    await settle();
  }

  pending(): number {
    return this.timers.length;
  }
}

/** Lets every pending promise chain run. */
export async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await new Promise((resolve) => setImmediate(resolve));
}

/** An EventSource the test opens, feeds and breaks. */
export class FakeEventSource implements EventSourceLike {
  static all: FakeEventSource[] = [];
  onopen: ((event: Event) => void) | null = null;
  onerror: ((event: Event) => void) | null = null;
  closed = false;
  private listeners = new Map<string, ((event: MessageEvent) => void)[]>();
  private lastId = "";

  constructor(readonly url: string) {
    FakeEventSource.all.push(this);
  }

  static reset(): void {
    FakeEventSource.all = [];
  }

  static open(): FakeEventSource[] {
    return FakeEventSource.all.filter((source) => !source.closed);
  }

  addEventListener(type: string, listener: (event: MessageEvent) => void): void {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), listener]);
  }

  close(): void {
    this.closed = true;
  }

  get params(): URLSearchParams {
    return new URL(this.url).searchParams;
  }

  /** The server answered 200. */
  open(): void {
    this.onopen?.(new Event("open"));
  }

  /** The server sent an event (an id sticks, as in a real EventSource). */
  emit(name: string, data: unknown, id?: string): void {
    if (id !== undefined) this.lastId = id;
    const event = new MessageEvent(name, { data: JSON.stringify(data), lastEventId: this.lastId });
    for (const listener of this.listeners.get(name) ?? []) listener(event);
  }

  /** The connection failed. */
  fail(): void {
    this.onerror?.(new Event("error"));
  }
}

/** A recorded fetch call. */
export interface Call {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: Record<string, string>;
  body: unknown;
}

type Route = (call: Call) => Response | Promise<Response>;

/** A fetch answering from routes ("GET /v1/inbox"), recording every call. */
export class FakeFetch {
  readonly calls: Call[] = [];
  private routes = new Map<string, Route>();

  on(key: string, route: Route): this {
    this.routes.set(key, route);
    return this;
  }

  readonly fetch = async (input: RequestInfo | URL, init: RequestInit = {}): Promise<Response> => {
    const url = new URL(String(input));
    const call: Call = {
      method: init.method ?? "GET",
      path: url.pathname,
      query: url.searchParams,
      headers: init.headers as Record<string, string>,
      body: init.body ? JSON.parse(String(init.body)) : undefined,
    };
    this.calls.push(call);
    const route = this.routes.get(`${call.method} ${call.path}`);
    if (!route) return json(404, { error: { code: "not_found", message: "no route" } });
    const signal = init.signal;
    if (!signal) return route(call);
    // As a real fetch: an abort rejects the call with the signal's reason, answered or not.
    signal.throwIfAborted();
    return Promise.race([
      route(call),
      new Promise<never>((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true })),
    ]);
  };

  count(key: string): number {
    return this.calls.filter((call) => `${call.method} ${call.path}` === key).length;
  }
}

/** A JSON answer. */
export function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...headers } });
}

/** Web Locks: exclusive, granted in request order, released when the callback's promise settles. */
export class FakeLocks implements LockManagerLike {
  private held = new Set<string>();
  private queue: { name: string; callback: () => Promise<void>; resolve: (v: unknown) => void; reject: (e: unknown) => void; signal?: AbortSignal }[] = [];

  request(name: string, options: { signal?: AbortSignal }, callback: () => Promise<void>): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const entry = { name, callback, resolve, reject, signal: options.signal };
      options.signal?.addEventListener("abort", () => {
        if (this.queue.includes(entry)) {
          this.queue = this.queue.filter((e) => e !== entry);
          reject(new DOMException("aborted", "AbortError"));
        }
      });
      this.queue.push(entry);
      this.grant();
    });
  }

  private grant(): void {
    for (const entry of [...this.queue]) {
      if (this.held.has(entry.name)) continue;
      this.queue = this.queue.filter((e) => e !== entry);
      this.held.add(entry.name);
      entry.callback().then(
        (value) => {
          this.held.delete(entry.name);
          entry.resolve(value);
          this.grant();
        },
        (error) => {
          this.held.delete(entry.name);
          entry.reject(error);
          this.grant();
        },
      );
    }
  }
}

/** BroadcastChannels of one "browser": a message reaches every other open channel of the name, asynchronously, cloned. */
export function fakeBroadcast() {
  const open = new Set<Channel>();
  class Channel implements BroadcastChannelLike {
    onmessage: ((event: MessageEvent) => void) | null = null;
    constructor(readonly name: string) {
      open.add(this);
    }
    postMessage(message: unknown): void {
      const copy = structuredClone(message);
      for (const other of open) {
        if (other !== this && other.name === this.name) {
          setImmediate(() => open.has(other) && other.onmessage?.(new MessageEvent("message", { data: copy })));
        }
      }
    }
    close(): void {
      open.delete(this);
    }
  }
  return Channel;
}

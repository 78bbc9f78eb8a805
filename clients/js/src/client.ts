/**
 * The headless client: one method per call of `notify-edge`
 * (docs/edge.md), typed by the OpenAPI document. It signs each call with
 * the app's user token, refreshing it before it ends and once more when
 * the edge answers `token_expired`, and turns every error answer into a
 * `NotifyError`.
 */
import { NotifyError, asNotifyError } from "./errors.js";
import { TokenSource, type GetToken } from "./token.js";
import type {
  AckResponse,
  Badge,
  ErrorBody,
  GroupMessages,
  GroupMessagesQuery,
  Groups,
  InboxPage,
  InboxQuery,
  Preferences,
  UpdateRequest,
  UpdateResponse,
} from "./types.js";

/** How to reach the edge. */
export interface ClientOptions {
  /** The edge's base URL (`https://edge.example.com`); the page's origin when absent. */
  edgeUrl?: string;
  /** The app's token provider: a fresh user token. */
  getToken: GetToken;
  /** The `fetch` to use (the global one). */
  fetch?: typeof fetch;
  /** The clock, ms since the epoch (`Date.now`). */
  now?: () => number;
}

type Query = Record<string, string | number | boolean | null | undefined>;

/** A client of one user's edge calls. */
export class NotifyClient {
  /** The edge's base URL, without a trailing slash. */
  readonly edgeUrl: string;
  /** The token cache in front of the provider. */
  readonly tokens: TokenSource;
  /**
   * When the edge last asked to wait (the end of a 429's or 503's
   * `Retry-After`), ms since the epoch; 0 when it has not. The live
   * stream waits for it before reconnecting.
   */
  retryNotBefore = 0;
  private readonly fetchImpl: typeof fetch;
  private readonly now: () => number;

  constructor(options: ClientOptions) {
    this.edgeUrl = (options.edgeUrl ?? globalThis.location?.origin ?? "").replace(/\/+$/, "");
    this.now = options.now ?? Date.now;
    this.tokens = new TokenSource(options.getToken, this.now);
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** `GET /v1/inbox`: a page of items, newest first; `signal` aborts the request. */
  inbox(query: InboxQuery = {}, signal?: AbortSignal): Promise<InboxPage> {
    return this.call("GET", "/v1/inbox", query, undefined, signal);
  }

  /** `GET /v1/badge`: unread, unseen and group counts. */
  badge(): Promise<Badge> {
    return this.call("GET", "/v1/badge");
  }

  /** `POST /v1/items/update`: an action on listed items or on every item a filter selects. */
  updateItems(request: UpdateRequest): Promise<UpdateResponse> {
    return this.call("POST", "/v1/items/update", undefined, request);
  }

  /** `GET /v1/preferences`: the muted categories and groups. */
  getPreferences(): Promise<Preferences> {
    return this.call("GET", "/v1/preferences");
  }

  /** `PUT /v1/preferences`: replaces them; answers what is stored. */
  setPreferences(preferences: Preferences): Promise<Preferences> {
    return this.call("PUT", "/v1/preferences", undefined, preferences);
  }

  /** `GET /v1/groups`: the user's groups with their unread counts. */
  groups(): Promise<Groups> {
    return this.call("GET", "/v1/groups");
  }

  /** `GET /v1/groups/{group_id}/messages`: messages after a seq, ascending. */
  groupMessages(groupId: string, query: GroupMessagesQuery = {}): Promise<GroupMessages> {
    return this.call("GET", `/v1/groups/${encodeURIComponent(groupId)}/messages`, query);
  }

  /** `POST /v1/groups/{group_id}/ack`: everything up to `seq` is read. */
  ackGroup(groupId: string, seq: number): Promise<AckResponse> {
    return this.call("POST", `/v1/groups/${encodeURIComponent(groupId)}/ack`, undefined, { seq });
  }

  /** The user the token names. */
  userId(): Promise<string> {
    return this.tokens.userId();
  }

  /**
   * The URL of `GET /v1/events` for an `EventSource`, which cannot set
   * headers: the token as `access_token` and the resume point as
   * `last_event_id`.
   */
  async eventsUrl(lastEventId = ""): Promise<string> {
    return this.url("/v1/events", { access_token: await this.tokens.token(), last_event_id: lastEventId || undefined });
  }

  private url(path: string, query: Query = {}): string {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== null) params.set(key, String(value));
    }
    const search = params.toString();
    return `${this.edgeUrl}${path}${search ? `?${search}` : ""}`;
  }

  private async call<T>(method: string, path: string, query?: Query, body?: unknown, signal?: AbortSignal): Promise<T> {
    const url = this.url(path, query);
    const send = async (token: string): Promise<Response> => {
      const headers: Record<string, string> = { Authorization: `Bearer ${token}`, Accept: "application/json" };
      if (body !== undefined) headers["Content-Type"] = "application/json";
      try {
        return await this.fetchImpl(url, { method, headers, body: body === undefined ? null : JSON.stringify(body), signal: signal ?? null });
      } catch (error) {
        throw asNotifyError(error, "network");
      }
    };
    let response = await send(await this.tokens.token());
    if (!response.ok) {
      const error = await this.failure(response);
      if (error.code !== "token_expired") throw error;
      response = await send(await this.tokens.refresh());
      if (!response.ok) throw await this.failure(response);
    }
    try {
      return (await response.json()) as T;
    } catch (error) {
      throw asNotifyError(error, "bad_response");
    }
  }

  /** The error of a non-2xx answer, noting a `Retry-After`. */
  private async failure(response: Response): Promise<NotifyError> {
    let detail: Partial<ErrorBody["error"]> = {};
    try {
      detail = ((await response.json()) as ErrorBody).error ?? {};
    } catch {
      detail = {};
    }
    const retryAfter = parseRetryAfter(response.headers.get("Retry-After"), this.now());
    if (retryAfter !== undefined) this.retryNotBefore = this.now() + retryAfter * 1000;
    return new NotifyError(
      response.status,
      detail.code ?? `http_${response.status}`,
      detail.message ?? `${response.status} ${response.statusText}`.trim(),
      detail.field ?? undefined,
      retryAfter,
    );
  }
}

/** `Retry-After` in seconds: delta-seconds or an HTTP date; undefined when absent or unreadable. */
export function parseRetryAfter(value: string | null, now: number): number | undefined {
  if (!value) return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim());
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - now) / 1000));
}

import { TokenSource, type GetToken } from "./token.js";
import type { AckResponse, Badge, GroupMessages, GroupMessagesQuery, Groups, InboxPage, InboxQuery, Preferences, UpdateRequest, UpdateResponse } from "./types.js";
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
/** A client of one user's edge calls. */
export declare class NotifyClient {
    /** The edge's base URL, without a trailing slash. */
    readonly edgeUrl: string;
    /** The token cache in front of the provider. */
    readonly tokens: TokenSource;
    /**
     * When the edge last asked to wait (the end of a 429's or 503's
     * `Retry-After`), ms since the epoch; 0 when it has not. The live
     * stream waits for it before reconnecting.
     */
    retryNotBefore: number;
    private readonly fetchImpl;
    private readonly now;
    constructor(options: ClientOptions);
    /** `GET /v1/inbox`: a page of items, newest first; `signal` aborts the request. */
    inbox(query?: InboxQuery, signal?: AbortSignal): Promise<InboxPage>;
    /** `GET /v1/badge`: unread, unseen and group counts. */
    badge(): Promise<Badge>;
    /** `POST /v1/items/update`: an action on listed items or on every item a filter selects. */
    updateItems(request: UpdateRequest): Promise<UpdateResponse>;
    /** `GET /v1/preferences`: the muted categories and groups. */
    getPreferences(): Promise<Preferences>;
    /** `PUT /v1/preferences`: replaces them; answers what is stored. */
    setPreferences(preferences: Preferences): Promise<Preferences>;
    /** `GET /v1/groups`: the user's groups with their unread counts. */
    groups(): Promise<Groups>;
    /** `GET /v1/groups/{group_id}/messages`: messages after a seq, ascending. */
    groupMessages(groupId: string, query?: GroupMessagesQuery): Promise<GroupMessages>;
    /** `POST /v1/groups/{group_id}/ack`: everything up to `seq` is read. */
    ackGroup(groupId: string, seq: number): Promise<AckResponse>;
    /** The user the token names. */
    userId(): Promise<string>;
    /**
     * The URL of `GET /v1/events` for an `EventSource`, which cannot set
     * headers: the token as `access_token` and the resume point as
     * `last_event_id`.
     */
    eventsUrl(lastEventId?: string): Promise<string>;
    private url;
    private call;
    /** The error of a non-2xx answer, noting a `Retry-After`. */
    private failure;
}
/** `Retry-After` in seconds: delta-seconds or an HTTP date; undefined when absent or unreadable. */
export declare function parseRetryAfter(value: string | null, now: number): number | undefined;

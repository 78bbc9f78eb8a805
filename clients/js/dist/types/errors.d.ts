/**
 * The one error type of the SDK: an edge's error answer
 * (`{"error": {"code", "field", "message"}}` with its HTTP status), or a
 * failure on the way to it (status 0: `network`, `stream_error`,
 * `token_provider`, `token_malformed`, `bad_response`).
 */
export declare class NotifyError extends Error {
    /** The HTTP status; 0 when no answer came. */
    readonly status: number;
    /** The edge's code (`invalid_argument`, `token_expired`, `rate_limited`, ...) or the SDK's own. */
    readonly code: string;
    /** The field a 400 names (`page_size`, `message_ids[3]`), if any. */
    readonly field: string | undefined;
    /** Seconds the edge asks to wait (`Retry-After` of a 429 or 503), if it said. */
    readonly retryAfter: number | undefined;
    constructor(status: number, code: string, message: string, field?: string, retryAfter?: number);
    /** A plain object of the fields, to cross a `BroadcastChannel` (which drops an Error's own fields). */
    toJSON(): NotifyErrorFields;
    /** The error again, from `toJSON()`'s fields. */
    static from(fields: NotifyErrorFields): NotifyError;
}
/** A `NotifyError` as plain data. */
export interface NotifyErrorFields {
    status: number;
    code: string;
    message: string;
    field?: string | undefined;
    retryAfter?: number | undefined;
}
/** Any thrown value as a `NotifyError` (others become `code`, status 0). */
export declare function asNotifyError(error: unknown, code: string): NotifyError;

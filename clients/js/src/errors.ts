/**
 * The one error type of the SDK: an edge's error answer
 * (`{"error": {"code", "field", "message"}}` with its HTTP status), or a
 * failure on the way to it (status 0: `network`, `stream_error`,
 * `token_provider`, `token_malformed`, `bad_response`).
 */
export class NotifyError extends Error {
  /** The HTTP status; 0 when no answer came. */
  readonly status: number;
  /** The edge's code (`invalid_argument`, `token_expired`, `rate_limited`, ...) or the SDK's own. */
  readonly code: string;
  /** The field a 400 names (`page_size`, `message_ids[3]`), if any. */
  readonly field: string | undefined;
  /** Seconds the edge asks to wait (`Retry-After` of a 429 or 503), if it said. */
  readonly retryAfter: number | undefined;

  constructor(status: number, code: string, message: string, field?: string, retryAfter?: number) {
    super(message);
    this.name = "NotifyError";
    this.status = status;
    this.code = code;
    this.field = field;
    this.retryAfter = retryAfter;
  }

  /** A plain object of the fields, to cross a `BroadcastChannel` (which drops an Error's own fields). */
  toJSON(): NotifyErrorFields {
    return { status: this.status, code: this.code, message: this.message, field: this.field, retryAfter: this.retryAfter };
  }

  /** The error again, from `toJSON()`'s fields. */
  static from(fields: NotifyErrorFields): NotifyError {
    return new NotifyError(fields.status, fields.code, fields.message, fields.field, fields.retryAfter);
  }
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
export function asNotifyError(error: unknown, code: string): NotifyError {
  if (error instanceof NotifyError) return error;
  return new NotifyError(0, code, error instanceof Error ? error.message : String(error));
}

/**
 * User tokens on the client side: reading a JWT's claims (no verification:
 * the edge verifies; the client only needs `exp` to refresh in time and
 * `sub` to name the user's cross-tab connection), and a cache around the
 * app's token provider that asks for a new token before the old one ends.
 */
import { NotifyError, asNotifyError } from "./errors.js";

/** The app's token provider: a fresh user token signed by the app's backend. */
export type GetToken = () => Promise<string>;

/** The claims the SDK reads. */
export interface TokenClaims {
  /** The user id, a decimal string. */
  sub: string;
  /** Expiry, seconds since the epoch. */
  exp: number;
  /** Issued at, seconds since the epoch, when present. */
  iat?: number;
}

/** Reads a JWT's payload (base64url JSON); throws `token_malformed` when it has no `sub` and `exp`. */
export function readClaims(token: string): TokenClaims {
  const payload = token.split(".")[1] ?? "";
  let claims: Partial<TokenClaims>;
  try {
    const base64 = payload.replace(/-/g, "+").replace(/_/g, "/");
    const binary = atob(base64 + "=".repeat((4 - (base64.length % 4)) % 4));
    claims = JSON.parse(new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0))));
  } catch {
    claims = {};
  }
  if (typeof claims.sub !== "string" || typeof claims.exp !== "number") {
    throw new NotifyError(0, "token_malformed", "the token provider returned a token without sub and exp");
  }
  return claims as TokenClaims;
}

/** Longest margin before `exp` at which a token is replaced. */
const MAX_MARGIN_MS = 60_000;
/** Shortest time a just-received token is used, so a skewed clock cannot make every call ask for a new one. */
const MIN_USE_MS = 5_000;

/**
 * Holds the current token and asks the provider for a new one when it is
 * within 60 s or a tenth of its lifetime (the smaller) of `exp`, or when
 * told to (`refresh()`, after a `token_expired`). Concurrent callers share
 * one provider call.
 */
export class TokenSource {
  private current: { token: string; claims: TokenClaims; renewAt: number } | null = null;
  private pending: Promise<string> | null = null;

  constructor(
    private readonly provider: GetToken,
    private readonly now: () => number = Date.now,
  ) {}

  /** A token good for a while yet: the cached one, or a new one. */
  token(): Promise<string> {
    if (this.current && this.now() < this.current.renewAt) return Promise.resolve(this.current.token);
    return this.refresh();
  }

  /**
   * A new token from the provider, whatever the cached one's expiry. The
   * shared call is forgotten once it settles, however it ends (the provider
   * threw, or returned a token without `sub` and `exp`), so the next call
   * asks the provider again rather than repeating the failure.
   */
  refresh(): Promise<string> {
    this.pending ??= new Promise<string>((resolve) => resolve(this.provider()))
      .then(
        (token) => {
          const claims = readClaims(token);
          const received = this.now();
          const expiry = claims.exp * 1000;
          const lifetime = expiry - (claims.iat !== undefined ? claims.iat * 1000 : received);
          const margin = Math.min(MAX_MARGIN_MS, Math.max(0, lifetime) / 10);
          this.current = { token, claims, renewAt: Math.max(expiry - margin, received + MIN_USE_MS) };
          return token;
        },
        (error: unknown) => {
          throw asNotifyError(error, "token_provider");
        },
      )
      .finally(() => (this.pending = null));
    return this.pending;
  }

  /** Forgets the cached token: the next `token()` asks the provider. */
  invalidate(): void {
    this.current = null;
  }

  /** The user the token names (its `sub`). */
  async userId(): Promise<string> {
    await this.token();
    return this.current?.claims.sub ?? "";
  }
}

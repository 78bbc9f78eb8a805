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
export declare function readClaims(token: string): TokenClaims;
/**
 * Holds the current token and asks the provider for a new one when it is
 * within 60 s or a tenth of its lifetime (the smaller) of `exp`, or when
 * told to (`refresh()`, after a `token_expired`). Concurrent callers share
 * one provider call.
 */
export declare class TokenSource {
    private readonly provider;
    private readonly now;
    private current;
    private pending;
    constructor(provider: GetToken, now?: () => number);
    /** A token good for a while yet: the cached one, or a new one. */
    token(): Promise<string>;
    /**
     * A new token from the provider, whatever the cached one's expiry. The
     * shared call is forgotten once it settles, however it ends (the provider
     * threw, or returned a token without `sub` and `exp`), so the next call
     * asks the provider again rather than repeating the failure.
     */
    refresh(): Promise<string>;
    /** Forgets the cached token: the next `token()` asks the provider. */
    invalidate(): void;
    /** The user the token names (its `sub`). */
    userId(): Promise<string>;
}

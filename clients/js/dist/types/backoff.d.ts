/**
 * Reconnect delays: exponential growth to a cap, with jitter so that the
 * tabs and devices an edge restart drops do not all come back at once.
 */
/** How delays grow. */
export interface BackoffOptions {
    /** The first delay's ceiling, ms (1 s). */
    baseMs?: number;
    /** The largest ceiling, ms (30 s). */
    capMs?: number;
    /** A number in [0, 1) (`Math.random`). */
    random?: () => number;
}
/**
 * The delay before retry number `attempt` (0 for the first): "equal
 * jitter", between half and all of `min(cap, base * 2^attempt)`, so it
 * grows with every failure and never exceeds the cap.
 */
export declare function backoffDelay(attempt: number, options?: BackoffOptions): number;

/**
 * "3 minutes ago" in the element's language, with
 * `Intl.RelativeTimeFormat` (no data shipped).
 */
/** How long ago (or until) `iso` is from `now`, in the largest fitting unit ("now" under a minute). */
export declare function relativeTime(iso: string, now: number, lang: string): string;
/** The full date and time, for the `<time>` element's tooltip. */
export declare function fullTime(iso: string, lang: string): string;

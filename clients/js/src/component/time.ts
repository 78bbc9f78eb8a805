/**
 * "3 minutes ago" in the element's language, with
 * `Intl.RelativeTimeFormat` (no data shipped).
 */

const UNITS: [Intl.RelativeTimeFormatUnit, number][] = [
  ["year", 365 * 86_400],
  ["month", 30 * 86_400],
  ["week", 7 * 86_400],
  ["day", 86_400],
  ["hour", 3_600],
  ["minute", 60],
];

const formats = new Map<string, Intl.RelativeTimeFormat>();

/** How long ago (or until) `iso` is from `now`, in the largest fitting unit ("now" under a minute). */
export function relativeTime(iso: string, now: number, lang: string): string {
  let format = formats.get(lang);
  if (!format) {
    try {
      format = new Intl.RelativeTimeFormat(lang || undefined, { numeric: "auto" });
    } catch {
      format = new Intl.RelativeTimeFormat("en", { numeric: "auto" });
    }
    formats.set(lang, format);
  }
  const seconds = (Date.parse(iso) - now) / 1000;
  for (const [unit, size] of UNITS) {
    if (Math.abs(seconds) >= size) return format.format(Math.trunc(seconds / size), unit);
  }
  return format.format(0, "second");
}

/** The full date and time, for the `<time>` element's tooltip. */
export function fullTime(iso: string, lang: string): string {
  try {
    return new Date(iso).toLocaleString(lang || undefined);
  } catch {
    return iso;
  }
}

/**
 * The element's stylesheet, adopted by its shadow root as a constructed
 * `CSSStyleSheet` (a page's CSP does not govern those, so no
 * `'unsafe-inline'` is needed). Every color, the radius and the font are
 * custom properties a page overrides; the dark set applies with
 * `theme="dark"`, or with `theme="auto"` when the system prefers dark.
 * Both sets keep text at 4.5:1 or more against its background.
 */
/** The stylesheet, built once and shared by every element on the page. */
export declare function styles(): CSSStyleSheet;

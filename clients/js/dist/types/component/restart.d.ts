/**
 * When setting a connection property of `<notify-inbox>` makes it
 * reconnect. Apart from the element, which needs a DOM, so that the rule
 * is unit-tested.
 */
/** The properties that choose the element's connection. */
export type ConnectionProperty = "getToken" | "client" | "store";
/**
 * Whether setting `property` from `old` to `value` needs a new client and
 * store. Not for the same value (a framework applying its props again), nor
 * for a token provider replacing another (the element's own client calls
 * whichever is current, so a re-render's new function is taken without
 * reconnecting); for anything else, yes.
 */
export declare function restarts(property: ConnectionProperty, old: unknown, value: unknown): boolean;

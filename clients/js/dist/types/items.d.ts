/**
 * The list's rules, as pure functions: which items a filter selects, what
 * an update's states do to an item, and where a new item goes. The store
 * applies the stream's events and the answers of updates with these, so
 * applying one twice changes nothing the second time.
 */
import type { Id, InboxItem, ItemDeliveredEvent, ItemFilter, ItemUpdatedEvent } from "./types.js";
/** The states an update sets (absent: unchanged). */
export interface ItemStates {
    seen?: boolean;
    read?: boolean;
    archived?: boolean;
    deleted?: boolean;
}
/** Orders ids numerically (they exceed a JS number). */
export declare function compareIds(a: Id, b: Id): number;
/** Whether the filter selects the item. */
export declare function matches(item: InboxItem, filter: ItemFilter): boolean;
/** The states an `item_updated` sets: those it names, over those its action implies. */
export declare function statesOf(update: ItemUpdatedEvent): ItemStates;
/** Whether the update targets the item (by id, by list, or by filter). */
export declare function targets(update: ItemUpdatedEvent, item: InboxItem): boolean;
/** The item after an update (null: deleted), with an edit's title and time. */
export declare function applyUpdate(item: InboxItem, update: ItemUpdatedEvent, states: ItemStates): InboxItem | null;
/** Whether an update may bring items the list does not hold into the filter's view. */
export declare function mayEnter(states: ItemStates, filter: ItemFilter): boolean;
/** An item from an `item_delivered` event: new, unread, unseen; no body until its page is read. */
export declare function fromDelivered(event: ItemDeliveredEvent): InboxItem;
/** Newest first: by `created_at`, then by id. */
export declare function newerFirst(a: InboxItem, b: InboxItem): number;

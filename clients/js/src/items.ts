/**
 * The list's rules, as pure functions: which items a filter selects, what
 * an update's states do to an item, and where a new item goes. The store
 * applies the stream's events and the answers of updates with these, so
 * applying one twice changes nothing the second time.
 */
import type { Action, Id, InboxItem, ItemDeliveredEvent, ItemFilter, ItemUpdatedEvent } from "./types.js";

/** The states an update sets (absent: unchanged). */
export interface ItemStates {
  seen?: boolean;
  read?: boolean;
  archived?: boolean;
  deleted?: boolean;
}

/** What each action sets. */
const ACTION_STATES: Record<Action, ItemStates> = {
  mark_seen: { seen: true },
  mark_read: { seen: true, read: true },
  mark_unread: { read: false },
  archive: { archived: true },
  unarchive: { archived: false },
  delete: { deleted: true },
};

/** Orders ids numerically (they exceed a JS number). */
export function compareIds(a: Id, b: Id): number {
  const x = BigInt(a);
  const y = BigInt(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

/** Whether the filter selects the item. */
export function matches(item: InboxItem, filter: ItemFilter): boolean {
  const view = filter.view ?? "inbox";
  if (view === "inbox" && item.archived) return false;
  if (view === "archive" && !item.archived) return false;
  if (filter.category && item.category !== filter.category) return false;
  if (filter.unread_only && item.read) return false;
  if (filter.read_only && !item.read) return false;
  if (filter.up_to_message_id && compareIds(item.message_id, filter.up_to_message_id) > 0) return false;
  return true;
}

/** The states an `item_updated` sets: those it names, over those its action implies. */
export function statesOf(update: ItemUpdatedEvent): ItemStates {
  const states: ItemStates = { ...(update.action ? ACTION_STATES[update.action] : {}) };
  for (const key of ["seen", "read", "archived", "deleted"] as const) {
    const value = update[key];
    if (value !== undefined && value !== null) states[key] = value;
  }
  return states;
}

/** Whether the update targets the item (by id, by list, or by filter). */
export function targets(update: ItemUpdatedEvent, item: InboxItem): boolean {
  if (update.message_id === item.message_id) return true;
  if (update.message_ids?.includes(item.message_id)) return true;
  return update.all ? matches(item, update.all) : false;
}

/** The item after an update (null: deleted), with an edit's title and time. */
export function applyUpdate(item: InboxItem, update: ItemUpdatedEvent, states: ItemStates): InboxItem | null {
  if (states.deleted) return null;
  const next = { ...item };
  if (states.seen !== undefined) next.seen = states.seen;
  if (states.read !== undefined) {
    next.read = states.read;
    if (states.read) next.seen = true;
  }
  if (states.archived !== undefined) next.archived = states.archived;
  if (update.title !== undefined && update.title !== null) next.title = update.title;
  if (update.edited_at) next.edited_at = update.edited_at;
  return next;
}

/** Whether an update may bring items the list does not hold into the filter's view. */
export function mayEnter(states: ItemStates, filter: ItemFilter): boolean {
  const view = filter.view ?? "inbox";
  return (
    (states.archived === false && view !== "archive") ||
    (states.archived === true && view !== "inbox") ||
    (states.read === false && !!filter.unread_only) ||
    (states.read === true && !!filter.read_only)
  );
}

/** An item from an `item_delivered` event: new, unread, unseen; no body until its page is read. */
export function fromDelivered(event: ItemDeliveredEvent): InboxItem {
  return {
    message_id: event.message_id,
    title: event.title,
    body: "",
    category: event.category,
    data: {},
    created_at: event.created_at,
    seen: false,
    read: false,
    archived: false,
  };
}

/** Newest first: by `created_at`, then by id. */
export function newerFirst(a: InboxItem, b: InboxItem): number {
  if (a.created_at !== b.created_at) return a.created_at < b.created_at ? 1 : -1;
  return compareIds(b.message_id, a.message_id);
}

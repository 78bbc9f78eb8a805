/**
 * The edge's JSON types, named: aliases of the schemas and query
 * parameters generated from `docs/edge-openapi.json` (see
 * `generated/edge-api.ts`), so the client cannot drift from the server.
 */
import type { components, operations } from "./generated/edge-api.js";

type Schemas = components["schemas"];

/** A message or group id: a decimal string (64-bit, beyond a JS number). */
export type Id = Schemas["Id"];
/** One item of the user's inbox. */
export type InboxItem = Schemas["InboxItem"];
/** A page of the inbox, newest first, with `next_cursor` until the last. */
export type InboxPage = Schemas["InboxPage"];
/** The user's counts: `unseen` is the bell's number. */
export type Badge = Schemas["Badge"];
/** A list view: `inbox`, `archive` or `all`. */
export type View = Schemas["View"];
/** Which items: the filter shared by pages and updates. */
export type ItemFilter = Schemas["ItemFilter"];
/** What an update does: `mark_seen`, `mark_read`, `mark_unread`, `archive`, `unarchive`, `delete`. */
export type Action = Schemas["Action"];
/** `POST /v1/items/update`'s body. */
export type UpdateRequest = Schemas["UpdateRequest"];
/** What an update changed, and the badge after it. */
export type UpdateResponse = Schemas["UpdateResponse"];
/** What the user mutes. */
export type Preferences = Schemas["Preferences"];
/** `GET /v1/groups`. */
export type Groups = Schemas["Groups"];
/** `GET /v1/groups/{group_id}/messages`. */
export type GroupMessages = Schemas["GroupMessages"];
/** The user's group cursor after an ack. */
export type AckResponse = Schemas["AckResponse"];
/** The body of every error answer. */
export type ErrorBody = Schemas["ErrorBody"];

/** The `snapshot` event. */
export type SnapshotEvent = Schemas["Snapshot"];
/** The `item_delivered` event. */
export type ItemDeliveredEvent = Schemas["ItemDelivered"];
/** The `item_updated` event. */
export type ItemUpdatedEvent = Schemas["ItemUpdated"];
/** The `item_revoked` event. */
export type ItemRevokedEvent = Schemas["ItemRevoked"];
/** The `group_message` event. */
export type GroupMessageEvent = Schemas["GroupMessageSent"];
/** The `resync` event. */
export type ResyncEvent = Schemas["Resync"];

/** `GET /v1/inbox`'s query. */
export type InboxQuery = NonNullable<operations["inbox"]["parameters"]["query"]>;
/** `GET /v1/groups/{group_id}/messages`'s query. */
export type GroupMessagesQuery = NonNullable<operations["group_messages"]["parameters"]["query"]>;

/** One event of the stream: its SSE name, its parsed body, and its id (`""` when it has none). */
export type StreamEvent =
  | { name: "snapshot"; data: SnapshotEvent; id: string }
  | { name: "badge"; data: Badge; id: string }
  | { name: "item_delivered"; data: ItemDeliveredEvent; id: string }
  | { name: "item_updated"; data: ItemUpdatedEvent; id: string }
  | { name: "item_revoked"; data: ItemRevokedEvent; id: string }
  | { name: "group_message"; data: GroupMessageEvent; id: string }
  | { name: "resync"; data: ResyncEvent; id: string };

/** The names of the stream's events. */
export type StreamEventName = StreamEvent["name"];

/** The connection's state: opening, open, or down and waiting to retry. */
export type Status = "connecting" | "live" | "offline";

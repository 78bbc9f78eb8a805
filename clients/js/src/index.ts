/**
 * `@notify-im/client`: Notify's browser SDK. Importing it defines
 * `<notify-inbox>` (unless the page already has) and exports the headless
 * client and the live store beneath it.
 */
import { defineNotifyInbox } from "./component/inbox-element.js";

export { NotifyClient, parseRetryAfter, type ClientOptions } from "./client.js";
export { NotifyError, type NotifyErrorFields } from "./errors.js";
export { NotifyStore, type ListFilter, type StoreOptions, type StoreState, type UpdateTarget } from "./store.js";
export { EventStream, type EventSourceConstructor, type EventSourceLike, type Timers } from "./stream.js";
export { TabLink, type BroadcastChannelConstructor, type LockManagerLike, type TabMessage } from "./tabs.js";
export { TokenSource, readClaims, type GetToken, type TokenClaims } from "./token.js";
export { backoffDelay, type BackoffOptions } from "./backoff.js";
export { en, zhCN, languages, type Strings } from "./strings.js";
export { NotifyInboxElement, defineNotifyInbox, type ItemClickDetail } from "./component/inbox-element.js";
export type * from "./types.js";

defineNotifyInbox();

/**
 * The element's words, replaceable: `element.strings = {...}` overrides
 * any of them, and the `lang` attribute (else the page's language) picks
 * a shipped set: English (`en`) and Simplified Chinese (`zh-CN`).
 * `{count}` and `{title}` are filled in where they appear.
 */

/** Every string the element shows or announces. */
export interface Strings {
  /** The bell's and the panel's name. */
  notifications: string;
  /** The bell's name when items are unseen. */
  bellUnseen: string;
  markAllRead: string;
  preferences: string;
  tabInbox: string;
  tabUnread: string;
  tabArchive: string;
  emptyInbox: string;
  emptyUnread: string;
  emptyArchive: string;
  loadError: string;
  retry: string;
  loading: string;
  unread: string;
  archive: string;
  unarchive: string;
  delete: string;
  /** Announced politely when an item arrives. */
  newItem: string;
  connecting: string;
  live: string;
  offline: string;
  mutedCategories: string;
  mutedHint: string;
  noCategories: string;
  preferencesError: string;
}

/** English. */
export const en: Strings = {
  notifications: "Notifications",
  bellUnseen: "Notifications, {count} unseen",
  markAllRead: "Mark all read",
  preferences: "Notification settings",
  tabInbox: "Inbox",
  tabUnread: "Unread",
  tabArchive: "Archive",
  emptyInbox: "You're all caught up.",
  emptyUnread: "No unread notifications.",
  emptyArchive: "Nothing archived.",
  loadError: "Notifications could not be loaded.",
  retry: "Retry",
  loading: "Loading…",
  unread: "Unread",
  archive: "Archive",
  unarchive: "Move to inbox",
  delete: "Delete",
  newItem: "New notification: {title}",
  connecting: "Connecting…",
  live: "Up to date",
  offline: "Offline, reconnecting…",
  mutedCategories: "Muted categories",
  mutedHint: "Notifications of a checked category are not sent to you.",
  noCategories: "No categories yet.",
  preferencesError: "Settings could not be loaded or saved.",
};

/** Simplified Chinese. */
export const zhCN: Strings = {
  notifications: "通知",
  bellUnseen: "通知，{count} 条未查看",
  markAllRead: "全部标为已读",
  preferences: "通知设置",
  tabInbox: "收件箱",
  tabUnread: "未读",
  tabArchive: "归档",
  emptyInbox: "暂无新通知。",
  emptyUnread: "没有未读通知。",
  emptyArchive: "归档为空。",
  loadError: "通知加载失败。",
  retry: "重试",
  loading: "加载中…",
  unread: "未读",
  archive: "归档",
  unarchive: "移回收件箱",
  delete: "删除",
  newItem: "新通知：{title}",
  connecting: "正在连接…",
  live: "已是最新",
  offline: "已离线，正在重连…",
  mutedCategories: "静音的类别",
  mutedHint: "选中类别的通知不会再发送给你。",
  noCategories: "暂无类别。",
  preferencesError: "设置加载或保存失败。",
};

/** The shipped sets, by language tag. */
export const languages: Record<string, Strings> = { en, "zh-CN": zhCN };

/** The shipped set for a language tag: `zh`, `zh-CN`, `zh-Hans...` take Chinese; anything else English. */
export function stringsFor(lang: string): Strings {
  return /^zh(-(cn|sg|hans)\b|$)/i.test(lang) ? zhCN : en;
}

/** A string with its `{name}` placeholders filled. */
export function format(text: string, values: Record<string, string | number>): string {
  return text.replace(/\{(\w+)\}/g, (whole, name: string) => (name in values ? String(values[name]) : whole));
}

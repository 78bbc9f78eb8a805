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
export declare const en: Strings;
/** Simplified Chinese. */
export declare const zhCN: Strings;
/** The shipped sets, by language tag. */
export declare const languages: Record<string, Strings>;
/** The shipped set for a language tag: `zh`, `zh-CN`, `zh-Hans...` take Chinese; anything else English. */
export declare function stringsFor(lang: string): Strings;
/** A string with its `{name}` placeholders filled. */
export declare function format(text: string, values: Record<string, string | number>): string;

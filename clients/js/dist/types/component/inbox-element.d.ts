/**
 * `<notify-inbox>`: a bell with the unseen count and a panel with the
 * user's notifications, on a `NotifyStore`. Shadow DOM, styled by custom
 * properties and `::part`s, keyboard navigable, announced to screen
 * readers, in English or Simplified Chinese (or any strings the page
 * sets). Titles and bodies are set as text, never parsed.
 */
import { NotifyClient } from "../client.js";
import { NotifyStore } from "../store.js";
import { type Strings } from "../strings.js";
import type { GetToken } from "../token.js";
import type { InboxItem } from "../types.js";
/** Detail of `notify:item-click`. */
export interface ItemClickDetail {
    item: InboxItem;
}
/** The `<notify-inbox>` element. */
export declare class NotifyInboxElement extends HTMLElement {
    static readonly observedAttributes: string[];
    private readonly root;
    private readonly bell;
    private readonly badge;
    private readonly panel;
    private readonly heading;
    private readonly status;
    private readonly markAll;
    private readonly prefsToggle;
    private readonly tablist;
    private readonly tabs;
    private readonly listPanel;
    private readonly list;
    private readonly more;
    private readonly empty;
    private readonly errorText;
    private readonly retry;
    private readonly error;
    private readonly prefs;
    private readonly live;
    private tokenProvider;
    private givenClient;
    private givenStore;
    /** The store in use: the given one, or one the element made (and stops when removed). */
    private active;
    private owned;
    private unsubscribe;
    private custom;
    private extraCategories;
    private tab;
    private readonly itemElements;
    private readonly fresh;
    /** The timers of announcements under way (cleared when the element leaves the page). */
    private readonly announceTimers;
    private state;
    private ready;
    private preferences;
    private observer;
    private clock;
    private readonly outside;
    constructor();
    /**
     * The app's token provider; setting one connects with a client and store
     * of the element's own. Another provider replacing it is called from the
     * next token on, without reconnecting (the same user's, as a framework's
     * re-render passes); for another user, set null first.
     */
    get getToken(): GetToken | null;
    set getToken(provider: GetToken | null);
    /** A client to use instead of a token provider (the element makes the store). */
    get client(): NotifyClient | null;
    set client(client: NotifyClient | null);
    /** The live store in use. Set one to share it with the page: the element starts it and follows its list, and never stops it. */
    get store(): NotifyStore | null;
    set store(store: NotifyStore | null);
    /** Strings over the language's set. */
    get strings(): Strings;
    set strings(strings: Partial<Strings>);
    /** Categories offered in the settings besides those of the items and the muted ones (also the `categories` attribute, comma-separated). */
    get categories(): string[];
    set categories(categories: string[]);
    connectedCallback(): void;
    disconnectedCallback(): void;
    attributeChangedCallback(name: string, old: string | null, value: string | null): void;
    /** Opens the panel, marks everything seen, and focuses the selected tab. */
    open(): void;
    /** Closes the panel, and the settings view (the next open shows the list and focuses its tab); `focusBell` returns the focus to the bell (as Escape does). */
    close(focusBell?: boolean): void;
    private language;
    private restart;
    private attach;
    private detach;
    private emit;
    /** Runs a store action, reporting its failure as `notify:error`. */
    private act;
    private renderStrings;
    private renderTabs;
    private render;
    private renderBadge;
    private renderList;
    private createItem;
    private fillItem;
    private itemOf;
    private onListClick;
    /** An item chosen: `notify:item-click`; unless a listener cancels it, the item is marked read and the panel closes. */
    private activate;
    private onListKey;
    private onTabKey;
    private selectTab;
    /** A new item: highlighted for a moment, and announced politely. */
    private announce;
    /** `setTimeout`, remembered until it runs so that leaving the page cancels it. */
    private later;
    private showPreferences;
    private preferencesFailed;
    /** The settings: a checkbox per category (the items', the muted ones, the page's), checked when muted. */
    private renderPreferences;
    private setMuted;
}
/** Defines `<notify-inbox>` unless the page already has. */
export declare function defineNotifyInbox(): void;

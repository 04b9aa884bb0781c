/**
 * meterhub in JupyterLab: "¥9.87 · ¥0.10/h · 98 h left" in the status bar, polled from the
 * server's /api/meterhub/status (also while the tab is hidden), styled by how near a stop is
 * (`data-level`, style/index.css) and telling of a near idle action or cap ("· idle: stops in
 * 4 min"); a JupyterLab notification for each new warning ("10 minutes of credit left — your
 * server will stop; your files are kept"), shown once and then marked read, an idle warning
 * with a "Keep running" button; and a save of every open document with unsaved changes before
 * a stop meterhub causes (src/saver.ts).
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import {
  ITranslator,
  TranslationBundle,
  nullTranslator
} from '@jupyterlab/translation';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import {
  IdleWarnings,
  NotificationReader,
  idleCancelled,
  noteType
} from './notes';
import {
  IOpenDocument,
  StopSaver,
  pollFrequency,
  statusPollOptions
} from './saver';
import {
  INote,
  IStatus,
  WARNING_KINDS,
  statusLevel,
  statusText
} from './status';

export { level, statusLevel, statusText } from './status';

/**
 * What of a document context the saver needs: `DocumentWidget.context`
 * (@jupyterlab/docregistry), by shape, so this extension needs no document manager.
 */
interface IDocumentContext {
  path: string;
  model: { dirty: boolean; readOnly: boolean };
  contentsModel: { writable?: boolean } | null;
  /**
   * False while a collaborative document saves itself on the server, or before it loaded.
   */
  canSave?: boolean;
  save(): Promise<void>;
}

function contextOf(widget: Widget): IDocumentContext | null {
  const context = (widget as { context?: Partial<IDocumentContext> }).context;
  if (
    !context ||
    typeof context.save !== 'function' ||
    typeof context.path !== 'string' ||
    typeof context.model?.dirty !== 'boolean'
  ) {
    return null;
  }
  return context as IDocumentContext;
}

/**
 * The open documents of the main area, each once (two views of a file share one context).
 */
function openDocuments(app: JupyterFrontEnd): IOpenDocument[] {
  const contexts = new Set<IDocumentContext>();
  for (const widget of app.shell.widgets('main')) {
    const context = contextOf(widget);
    if (context) {
      contexts.add(context);
    }
  }
  return [...contexts].map(context => ({
    path: context.path,
    dirty: context.model.dirty,
    writable:
      !context.model.readOnly &&
      context.contentsModel?.writable !== false &&
      context.canSave !== false,
    save: () => context.save()
  }));
}

/**
 * The status bar item: the credit, refreshed by a poll that backs off while the server fails;
 * the notifications; and the saves before a stop.
 */
class CreditStatus extends Widget {
  constructor(app: JupyterFrontEnd, translator: ITranslator) {
    super();
    this._settings = app.serviceManager.serverSettings;
    this._trans = translator.load('meterhub');
    // messages from the billing service come back in JupyterLab's language
    this._language = translator.languageCode || 'en';
    this.id = 'meterhub-credit-status';
    this.addClass('jp-StatusBar-TextItem');
    this.addClass('meterhub-credit-status');
    this.node.title = this._trans.__('meterhub: your credit');
    this.node.textContent = this._trans.__('credit …');
    this._reader = new NotificationReader({
      show: note => this._showNote(note),
      // the page marks what it showed by itself: not the user's activity, which would put off
      // the very idle stop an idle warning announces (the server's ReadHandler does not count it)
      markRead: ids => this._post('api/meterhub/notifications/read', { ids }),
      onError: error =>
        console.warn('meterhub: could not mark notifications read', error)
    });
    this._idleWarnings = new IdleWarnings(id => Notification.dismiss(id));
    this._saver = new StopSaver({
      documents: () => openDocuments(app),
      announce: () => this._post('api/meterhub/saving'),
      onError: (what, error) =>
        console.warn(`meterhub: could not ${what} before a stop`, error)
    });
    // A hidden tab keeps polling: it must save before a stop too (src/saver.ts).
    this._poll = new Poll(
      statusPollOptions(() => this.refresh(), document.hidden)
    );
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  /**
   * Ask for the status once and act on it. Rejects when the server fails, so the poll backs
   * off.
   */
  async refresh(): Promise<void> {
    let status: IStatus;
    try {
      const response = await ServerConnection.makeRequest(
        this._url('api/meterhub/status') +
          URLExt.objectToQueryString({ lang: this._language }),
        {},
        this._settings
      );
      if (!response.ok) {
        throw await ServerConnection.ResponseError.create(response);
      }
      status = (await response.json()) as IStatus;
    } catch (error) {
      this.node.textContent = this._trans.__('credit unavailable');
      delete this.node.dataset.level;
      throw error;
    }
    this._status = status;
    // first the save: a stop may be seconds away; the poll does not wait for it (a save can
    // wait on a dialog, such as "the file changed on disk")
    void this._saver.check(status.notifications, status.stop).then(report => {
      if (report && (report.saved.length || report.failed.length)) {
        console.info('meterhub: saved before a stop', report);
      }
    });
    this.node.textContent = statusText(status, this._trans);
    this.node.dataset.level = statusLevel(status);
    this._idleWarnings.update(status.idle);
    await this._reader.read(status.notifications);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    document.removeEventListener('visibilitychange', this._onVisibility);
    this._poll.dispose();
    super.dispose();
  }

  private _onVisibility = (): void => {
    this._poll.frequency = pollFrequency(document.hidden);
    if (!document.hidden) {
      // shown again: what the status bar says may be a hidden interval old
      void this._poll.refresh();
    }
  };

  private _showNote(note: INote): void {
    if (WARNING_KINDS.get(note.kind)?.keepRunning) {
      this._showIdleWarning(note);
    } else if (noteType(note.kind) === 'warning') {
      // stays until dismissed: a warning about a stop must not slip by
      Notification.warning(note.message, { autoClose: false });
    } else {
      Notification.info(note.message, { autoClose: false });
    }
  }

  /**
   * An idle warning with "Keep running": the click is activity, so the idle stop is off. Not
   * shown when the same status says activity already cancelled it.
   */
  private _showIdleWarning(note: INote): void {
    if (idleCancelled(this._status?.idle)) {
      return;
    }
    const id = Notification.warning(note.message, {
      autoClose: false,
      actions: [
        {
          label: this._trans.__('Keep running'),
          caption: this._trans.__(
            'Count this as activity: the server keeps running'
          ),
          displayType: 'accent',
          callback: event => {
            // dismissed once the server heard it, not before
            event.preventDefault();
            void this._keepRunning(id);
          }
        }
      ]
    });
    this._idleWarnings.add(id);
  }

  private async _keepRunning(id: string): Promise<void> {
    try {
      await this._idleWarnings.keepRunning(id, () =>
        this._post('api/meterhub/activity')
      );
    } catch (error) {
      console.warn(
        'meterhub: could not tell the server to keep running',
        error
      );
      // the warning and its button stay, to try again
      Notification.error(
        this._trans.__(
          'Your server did not answer "Keep running"; try again, or use it (run a cell, save a file).'
        ),
        { autoClose: 10 * 1000 }
      );
      return;
    }
    // the status bar's "idle: stops in …" goes now, not at the next poll
    void this._poll.refresh();
  }

  /**
   * POST to one of the server's own endpoints, with `body` as JSON if given; rejects unless it
   * answers 2xx.
   */
  private async _post(path: string, body?: unknown): Promise<void> {
    const response = await ServerConnection.makeRequest(
      this._url(path),
      body === undefined
        ? { method: 'POST' }
        : { method: 'POST', body: JSON.stringify(body) },
      this._settings
    );
    if (!response.ok) {
      throw await ServerConnection.ResponseError.create(response);
    }
  }

  private _url(path: string): string {
    return URLExt.join(this._settings.baseUrl, path);
  }

  private _settings: ServerConnection.ISettings;
  private _trans: TranslationBundle;
  private _language: string;
  private _reader: NotificationReader;
  private _idleWarnings: IdleWarnings;
  private _saver: StopSaver;
  private _status: IStatus | null = null;
  private _poll: Poll;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@meterhub/credit-status:plugin',
  description:
    'Credit left in the status bar, warnings before a stop, and a save before it.',
  autoStart: true,
  optional: [IStatusBar, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    translator: ITranslator | null
  ) => {
    const item = new CreditStatus(app, translator ?? nullTranslator);
    if (statusBar) {
      statusBar.registerStatusItem(plugin.id, {
        item,
        align: 'left',
        rank: 0
      });
    }
  }
};

export default plugin;

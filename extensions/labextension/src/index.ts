/**
 * meterhub in JupyterLab: "¥9.87 · ¥0.10/h · 98 h left" in the status bar, refreshed every
 * few seconds from the server's /api/meterhub/status, coloured as the warnings near, and a
 * JupyterLab notification for each new warning ("10 minutes of credit left — your server
 * will stop; your files are kept").
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

const REFRESH_MS = 5000;
const SYMBOLS: Record<string, string> = { CNY: '¥', USD: '$', EUR: '€' };

interface Note {
  id: number;
  kind: string;
  message: string;
}

interface Status {
  balance: string;
  currency: string;
  rate_per_hour: string;
  minutes_left: number | null;
  profile: string;
  gpus: number;
  notifications: Note[];
}

function left(minutes: number | null): string {
  if (minutes === null) {
    return 'not charging';
  }
  if (minutes >= 60) {
    return `${Math.floor(minutes / 60)} h left`;
  }
  return `${minutes} min left`;
}

export function statusText(status: Status): string {
  const symbol = SYMBOLS[status.currency] ?? `${status.currency} `;
  return `${symbol}${status.balance} · ${symbol}${status.rate_per_hour}/h · ${left(
    status.minutes_left
  )}`;
}

export function level(minutes: number | null): string {
  if (minutes !== null && minutes <= 10) {
    return 'critical';
  }
  if (minutes !== null && minutes <= 30) {
    return 'warning';
  }
  return 'ok';
}

class CreditStatus extends Widget {
  private seen = new Set<number>();
  private first = true;

  constructor(private settings: ServerConnection.ISettings) {
    super();
    this.id = 'meterhub-credit-status';
    this.addClass('meterhub-credit-status');
    this.node.title = 'meterhub: your credit';
    this.node.textContent = 'credit …';
  }

  async refresh(): Promise<void> {
    const url = URLExt.join(this.settings.baseUrl, 'api/meterhub/status');
    let status: Status;
    try {
      const response = await ServerConnection.makeRequest(url, {}, this.settings);
      if (!response.ok) {
        this.node.textContent = 'credit unavailable';
        return;
      }
      status = (await response.json()) as Status;
    } catch {
      this.node.textContent = 'credit unavailable';
      return;
    }
    this.node.textContent = statusText(status);
    this.node.dataset.level = level(status.minutes_left);
    const colours: Record<string, string> = {
      ok: '',
      warning: 'var(--jp-warn-color1, #e67700)',
      critical: 'var(--jp-error-color1, #c92a2a)'
    };
    this.node.style.color = colours[level(status.minutes_left)];
    for (const note of status.notifications) {
      if (this.seen.has(note.id)) {
        continue;
      }
      this.seen.add(note.id);
      if (note.kind === 'warning' || note.kind === 'stopped' || note.kind === 'pass-ended') {
        Notification.warning(note.message, { autoClose: false });
      }
    }
    this.first = false;
  }

  get started(): boolean {
    return !this.first;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@meterhub/credit-status:plugin',
  description: 'Credit left in the status bar, and warnings before a stop.',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const item = new CreditStatus(app.serviceManager.serverSettings);
    if (statusBar) {
      statusBar.registerStatusItem(plugin.id, { item, align: 'left', rank: 0 });
    }
    void item.refresh();
    window.setInterval(() => void item.refresh(), REFRESH_MS);
  }
};

export default plugin;

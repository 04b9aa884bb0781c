import {
  IOpenDocument,
  SAVE_BEFORE_STOP_SECONDS,
  STOP_SLACK_SECONDS,
  StopSaver,
  pollFrequency,
  statusPollOptions
} from '../saver';
import { INote, IStop } from '../status';

function note(id: number, kind: string): INote {
  return { id, kind, message: `note ${id}` };
}

/**
 * An open document that records its saves in the shared log, and can be made to fail.
 */
class FakeDocument implements IOpenDocument {
  constructor(
    public path: string,
    private log: string[],
    public dirty = true,
    public writable = true,
    private failing = false
  ) {}

  async save(): Promise<void> {
    this.log.push(`save ${this.path}`);
    if (this.failing) {
      throw new Error(`403: ${this.path} is read-only on disk`);
    }
    this.dirty = false;
  }
}

/**
 * A page with documents, a server that hears announcements, and a clock to move.
 */
class Page {
  log: string[] = [];
  errors: string[] = [];
  documents: FakeDocument[] = [];
  announceFails = false;
  nowMs = 1_000_000;
  saver = new StopSaver({
    documents: () => this.documents,
    announce: async () => {
      this.log.push('announce');
      if (this.announceFails) {
        throw new Error('502: the server did not answer');
      }
    },
    onError: what => this.errors.push(what),
    now: () => this.nowMs
  });

  open(path: string, dirty = true, writable = true, failing = false) {
    const doc = new FakeDocument(path, this.log, dirty, writable, failing);
    this.documents.push(doc);
    return doc;
  }

  /**
   * A status `seconds` later.
   */
  after(seconds: number, notes: INote[], stop: IStop | null = null) {
    this.nowMs += seconds * 1000;
    return this.saver.check(notes, stop);
  }
}

describe('StopSaver: what calls for a save', () => {
  it.each(['warning', 'idle-warning', 'cap-warning', 'stopped'])(
    'saves when a %s note arrives',
    async kind => {
      const page = new Page();
      page.open('a.ipynb');
      const report = await page.after(0, [note(1, kind)]);
      expect(report).toEqual({
        why: `note: ${kind}`,
        saved: ['a.ipynb'],
        failed: []
      });
      expect(page.log).toEqual(['announce', 'save a.ipynb']);
    }
  );

  it.each(['restarted', 'pass-ended', 'news'])(
    'does not save for a %s note',
    async kind => {
      const page = new Page();
      page.open('a.ipynb');
      expect(await page.after(0, [note(1, kind)])).toBeNull();
      expect(page.log).toEqual([]);
    }
  );

  it('saves for each note once, however often the status lists it', async () => {
    const page = new Page();
    const doc = page.open('a.ipynb');
    await page.after(0, [note(1, 'warning')]);
    doc.dirty = true;
    // not yet marked read: the next status lists it again
    expect(await page.after(15, [note(1, 'warning')])).toBeNull();
    expect(
      await page.after(15, [note(1, 'warning'), note(2, 'idle-warning')])
    ).not.toBeNull();
    expect(page.log).toEqual([
      'announce',
      'save a.ipynb',
      'announce',
      'save a.ipynb'
    ]);
  });

  it(`saves once a stop is at most ${SAVE_BEFORE_STOP_SECONDS} s away, once per stop`, async () => {
    const page = new Page();
    const doc = page.open('a.ipynb');
    const idle = (in_seconds: number): IStop => ({
      reason: 'idle',
      in_seconds
    });
    expect(await page.after(0, [], idle(60))).toBeNull();
    expect(await page.after(14, [], idle(46))).toBeNull();
    const report = await page.after(15, [], idle(31));
    expect(report?.why).toBe('stop: idle in 31 s');
    expect(report?.saved).toEqual(['a.ipynb']);
    // the same stop, 15 s nearer: typed since, but saved for already
    doc.dirty = true;
    expect(await page.after(15, [], idle(16))).toBeNull();
    // a second later than 15 s on would make it: still the same stop
    expect(await page.after(15, [], idle(2))).toBeNull();
    expect(page.log).toEqual(['announce', 'save a.ipynb']);
  });

  it('saves again for a new stop: after none, after a farther one, after it moved later', async () => {
    const page = new Page();
    const doc = page.open('a.ipynb');
    const stop = (reason: IStop['reason'], in_seconds: number): IStop => ({
      reason,
      in_seconds
    });
    expect((await page.after(0, [], stop('idle', 40)))?.why).toBe(
      'stop: idle in 40 s'
    );
    // activity: no stop foreseen, then the next idle stop comes near
    doc.dirty = true;
    expect(await page.after(15, [], null)).toBeNull();
    expect(await page.after(15, [], stop('idle', 40))).not.toBeNull();
    // activity between two polls moved the stop later without leaving the window
    doc.dirty = true;
    expect(await page.after(15, [], stop('idle', 25))).toBeNull();
    // 15 s on it would say 10 s: up to STOP_SLACK_SECONDS later is the same stop
    expect(
      await page.after(15, [], stop('idle', 10 + STOP_SLACK_SECONDS))
    ).toBeNull();
    // ...but later than that is a new one
    expect(
      await page.after(0, [], stop('idle', 10 + STOP_SLACK_SECONDS + 1))
    ).not.toBeNull();
    // a farther stop in between (a grant), then near again
    doc.dirty = true;
    expect(await page.after(15, [], stop('credit', 600))).toBeNull();
    expect(await page.after(15, [], stop('credit', 45))).not.toBeNull();
    // another reason within the window is another stop
    doc.dirty = true;
    expect((await page.after(15, [], stop('cap', 20)))?.why).toBe(
      'stop: cap in 20 s'
    );
    expect(page.log.filter(line => line === 'announce')).toHaveLength(5);
  });
});

describe('StopSaver: the save', () => {
  it('announces first, then saves the dirty writable documents only', async () => {
    const page = new Page();
    page.open('dirty.ipynb');
    page.open('clean.ipynb', false);
    page.open('readonly.ipynb', true, false);
    page.open('notes.md');
    const report = await page.saver.save('test');
    expect(page.log).toEqual(['announce', 'save dirty.ipynb', 'save notes.md']);
    expect(report).toEqual({
      why: 'test',
      saved: ['dirty.ipynb', 'notes.md'],
      failed: []
    });
  });

  it('starts saving only once the server heard the announcement', async () => {
    const log: string[] = [];
    let heard: () => void = () => undefined;
    const saver = new StopSaver({
      documents: () => [new FakeDocument('a.ipynb', log)],
      announce: () =>
        new Promise<void>(resolve => {
          log.push('announce sent');
          heard = () => {
            log.push('announce answered');
            resolve();
          };
        })
    });
    const saving = saver.save('test');
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(log).toEqual(['announce sent']);
    heard();
    await saving;
    expect(log).toEqual(['announce sent', 'announce answered', 'save a.ipynb']);
  });

  it('asks the server nothing when nothing needs saving', async () => {
    const page = new Page();
    page.open('clean.ipynb', false);
    expect((await page.after(0, [note(1, 'warning')]))?.saved).toEqual([]);
    expect(page.log).toEqual([]);
  });

  it('a failing save is reported and does not stop the others', async () => {
    const page = new Page();
    page.open('a.ipynb');
    page.open('gone.ipynb', true, true, true);
    page.open('c.ipynb');
    const report = await page.saver.save('test');
    expect(report.saved).toEqual(['a.ipynb', 'c.ipynb']);
    expect(report.failed).toEqual(['gone.ipynb']);
    expect(page.errors).toEqual(['save gone.ipynb']);
    expect(page.log).toContain('save c.ipynb');
  });

  it('saves even when the server did not hear the announcement', async () => {
    const page = new Page();
    page.open('a.ipynb');
    page.announceFails = true;
    const report = await page.saver.save('test');
    expect(page.errors).toEqual(['announce the save']);
    expect(report.saved).toEqual(['a.ipynb']);
  });

  it('does not overlap saves: the second starts after the first, with what changed since', async () => {
    const page = new Page();
    const doc = page.open('a.ipynb');
    let finish: () => void = () => undefined;
    doc.save = () => {
      page.log.push('save a.ipynb started');
      return new Promise<void>(resolve => {
        finish = () => {
          page.log.push('save a.ipynb done');
          doc.dirty = false;
          resolve();
        };
      });
    };
    const first = page.saver.save('first');
    const second = page.saver.save('second');
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(page.log).toEqual(['announce', 'save a.ipynb started']);
    finish();
    expect((await first).saved).toEqual(['a.ipynb']);
    // clean by now: the second has nothing to save
    expect((await second).saved).toEqual([]);
    expect(page.log).toEqual([
      'announce',
      'save a.ipynb started',
      'save a.ipynb done'
    ]);
  });
});

describe('polling (the options index.ts gives its Poll)', () => {
  it('a hidden tab still polls often enough to see the last seconds before a stop', () => {
    const factory = () => Promise.resolve();
    const hidden = statusPollOptions(factory, true);
    expect(hidden.standby).toBe('never');
    expect(hidden.factory).toBe(factory);
    expect(hidden.frequency).toEqual(pollFrequency(true));
    const interval = pollFrequency(true).interval as number;
    expect(interval).toBeLessThan(SAVE_BEFORE_STOP_SECONDS * 1000);
    // it only asks less often than a shown tab
    expect(pollFrequency(false).interval).toBeLessThanOrEqual(interval);
  });

  it('backs off while the server fails, up to a limit', () => {
    for (const hidden of [true, false]) {
      const frequency = pollFrequency(hidden);
      expect(frequency.backoff).toBe(true);
      expect(frequency.max).toBeGreaterThan(frequency.interval as number);
    }
  });
});

import { IStatus, level, statusText } from '../status';

const STATUS: IStatus = {
  user: 'zed',
  balance: '9.87',
  currency: 'CNY',
  rate_per_hour: '0.10',
  minutes_left: 5922,
  warn_minutes: [30, 10, 2],
  profile: 'debug',
  gpus: 0,
  notifications: []
};

describe('statusText', () => {
  it('shows balance, rate and whole hours left', () => {
    expect(statusText(STATUS)).toBe('¥9.87 · ¥0.10/h · 98 h left');
  });

  it('shows minutes under an hour', () => {
    expect(statusText({ ...STATUS, minutes_left: 59 })).toBe(
      '¥9.87 · ¥0.10/h · 59 min left'
    );
  });

  it('says when nothing is charging', () => {
    expect(
      statusText({ ...STATUS, rate_per_hour: '0.00', minutes_left: null })
    ).toBe('¥9.87 · ¥0.00/h · not charging');
  });

  it('spells a currency it has no symbol for', () => {
    expect(statusText({ ...STATUS, currency: 'JPY' })).toBe(
      'JPY 9.87 · JPY 0.10/h · 98 h left'
    );
  });
});

describe('level', () => {
  it('warns at or below the largest threshold, critical at or below the second', () => {
    const thresholds = [30, 10, 2];
    expect(level(31, thresholds)).toBe('ok');
    expect(level(30, thresholds)).toBe('warning');
    expect(level(11, thresholds)).toBe('warning');
    expect(level(10, thresholds)).toBe('critical');
    expect(level(0, thresholds)).toBe('critical');
  });

  it('takes the thresholds in any order', () => {
    expect(level(45, [5, 60])).toBe('warning');
    expect(level(5, [5, 60])).toBe('critical');
    expect(level(61, [5, 60])).toBe('ok');
  });

  it('is critical at or below the only threshold', () => {
    expect(level(16, [15])).toBe('ok');
    expect(level(15, [15])).toBe('critical');
  });

  it('is ok when nothing is charging or the site has no thresholds', () => {
    expect(level(null, [30, 10])).toBe('ok');
    expect(level(1, [])).toBe('ok');
  });
});

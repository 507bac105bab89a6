/** What the suite shows while it runs: two bars on a terminal (the whole run, the current phase), plain lines elsewhere. */
import cliProgress from 'cli-progress';

export class Progress {
  private readonly multi?: cliProgress.MultiBar;
  private readonly total?: cliProgress.SingleBar;
  private readonly phase?: cliProgress.SingleBar;
  private doneS = 0;

  /** `bars`: draw the bars (else plain lines on stderr); `plannedS`: the whole run's estimate. */
  constructor(
    bars: boolean,
    private readonly plannedS: number,
  ) {
    if (!bars) return;
    this.multi = new cliProgress.MultiBar(
      { format: ' {bar} {percentage}% | {label} | {info}', barsize: 30, hideCursor: true, clearOnComplete: false, stream: process.stderr },
      cliProgress.Presets.shades_classic,
    );
    this.total = this.multi.create(Math.round(plannedS), 0, { label: 'suite'.padEnd(44), info: `~${Math.round(plannedS)} s planned` });
    this.phase = this.multi.create(1, 0, { label: ''.padEnd(44), info: '' });
  }

  start(label: string, seconds: number): void {
    this.phase?.setTotal(Math.max(1, Math.round(seconds * 10)));
    this.phase?.update(0, { label: label.slice(0, 44).padEnd(44), info: '' });
  }

  tick(fraction: number, info: string): void {
    this.phase?.update(Math.round(fraction * (this.phase.getTotal() ?? 1)), { info });
  }

  finish(label: string, seconds: number, line: string): void {
    this.doneS += seconds;
    this.total?.update(Math.min(Math.round(this.doneS), Math.round(this.plannedS)), { info: `${Math.round(this.doneS)} of ~${Math.round(this.plannedS)} s` });
    this.log(`${label}: ${line}`);
  }

  log(line: string): void {
    if (this.multi) this.multi.log(line + '\n');
    else process.stderr.write(line + '\n');
  }

  stop(): void {
    this.multi?.stop();
  }
}

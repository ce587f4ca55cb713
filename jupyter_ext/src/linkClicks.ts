/**
 * Clicks on the links of a cell's status line (kernelside/display/run_links.py): the run's name
 * (its dashboard) and each rank's log. The line is redrawn every second, so a link is opened on
 * pointerup (whose target is the link under the pointer, even if the one pressed was replaced
 * meanwhile); keyboard activation arrives as a click without a pointer.
 *
 * Example: listenToLinks('a.nblaunch-run-link[data-nblaunch-run]', link => open(link.dataset.nblaunchRun))
 */

/** Call open(link) when a link matching selector anywhere in the document is activated. */
export function listenToLinks(selector: string, open: (link: HTMLElement) => void): void {
  const linkOf = (event: Event) =>
    (event.target as Element | null)?.closest?.(selector) as HTMLElement | null;
  document.addEventListener(
    'pointerup',
    event => {
      const link = linkOf(event);
      if (link && event.button === 0) {
        open(link);
      }
    },
    true
  );
  document.addEventListener(
    'click',
    event => {
      const link = linkOf(event);
      if (link) {
        event.preventDefault();
        if (event.detail === 0) {
          open(link);
        }
      }
    },
    true
  );
}

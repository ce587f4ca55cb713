/** The sidebar icon: three connected workers. Colours follow the theme (jp-icon3). */

import { LabIcon } from '@jupyterlab/ui-components';

const SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <circle cx="12" cy="5" r="3"/>
    <circle cx="5" cy="19" r="3"/>
    <circle cx="19" cy="19" r="3"/>
    <path d="M11 7.5h2v4.2l5.1 4.9-1.4 1.4L12 13.4l-4.7 4.6-1.4-1.4 5.1-4.9z"/>
  </g>
</svg>`;

export const launchIcon = new LabIcon({ name: 'nblaunch:launch', svgstr: SVG });

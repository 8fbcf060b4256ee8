; Inno Setup 6 script: Tramontane installer for Windows (x64), per-user by default (no admin).
; Built by build_windows.ps1, which passes the version and the bundle folder:
;   ISCC.exe /DAppVersion=<pyproject version> /DSourceDir=<repo>\dist\tramontane packaging\windows\tramontane.iss
; Output: dist\tramontane-<version>-windows-x64-setup.exe

#ifndef AppVersion
  #error Pass the version: ISCC /DAppVersion=X.Y.Z (build_windows.ps1 reads it from the package)
#endif
#ifndef SourceDir
  #define SourceDir "..\..\dist\tramontane"
#endif

[Setup]
AppId={{6F1C2B8E-4D3A-4E5B-9C7D-2A1B3C4D5E6F}
AppName=Tramontane
AppVersion={#AppVersion}
AppVerName=Tramontane {#AppVersion}
AppPublisher=Tramontane
DefaultDirName={autopf}\Tramontane
DefaultGroupName=Tramontane
DisableProgramGroupPage=yes
; Per-user install into %LOCALAPPDATA%\Programs; the user may choose all users (then admin).
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=tramontane-{#AppVersion}-windows-x64-setup
SetupIconFile=..\icons\tramontane.ico
UninstallDisplayIcon={app}\tramontane.exe
UninstallDisplayName=Tramontane {#AppVersion}
Compression=lzma2/max
SolidCompression=yes
; A CUDA build compresses to more than the 2 GB one setup .exe can hold: ISCC /DSplit puts the
; payload in setup-*.bin files beside the .exe (ship them together).
#ifdef Split
DiskSpanning=yes
DiskSliceSize=max
#endif
WizardStyle=modern
CloseApplications=yes

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[InstallDelete]
; An upgrade replaces the bundle whole: no stale libraries from the previous version.
Type: filesandordirs; Name: "{app}\_internal"

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\Tramontane"; Filename: "{app}\tramontane.exe"; IconFilename: "{app}\tramontane.exe"
Name: "{autodesktop}\Tramontane"; Filename: "{app}\tramontane.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\tramontane.exe"; Description: "{cm:LaunchProgram,Tramontane}"; Flags: nowait postinstall skipifsilent

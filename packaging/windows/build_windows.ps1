# Builds the Windows bundle and installer (run in PowerShell from anywhere):
#   dist\tramontane\                                   tramontane.exe (GUI), tramontane-cli.exe, _internal\
#   dist\tramontane-<version>-windows-x64-setup.exe    Inno Setup installer
#
# Needs: Python 3.11+ x64 with the app and the torch build to ship installed, PyInstaller, and
# Inno Setup 6 (ISCC.exe on PATH or in its default folder). For example:
#   py -3.11 -m venv .venv; .venv\Scripts\activate
#   pip install torch    # Windows wheels on PyPI are CPU builds; for CUDA use the index PyTorch's install page names
#   pip install . pyinstaller
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build_windows.ps1
# Triton has no Windows wheels: the kernels' torch path runs (tramontane.spec leaves Triton out).
# Not run in CI (no Windows machine): the script is kept in step with build_linux.sh by hand.
param(
    [string]$Python = "python",
    [switch]$NoInstaller,
    [switch]$Split  # payload in setup-*.bin files: needed when it compresses to over 2 GB (CUDA torch)
)
$ErrorActionPreference = "Stop"
$Root = Resolve-Path (Join-Path $PSScriptRoot "..\..")
Set-Location $Root

$Version = & $Python -c "import tramontane; print(tramontane.__version__)"
if ($LASTEXITCODE -ne 0 -or $Version -like "0+unknown*") { throw "tramontane is not installed in $Python (pip install .)" }

& $Python -m PyInstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build\pyinstaller packaging\tramontane.spec
if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }

# The GUI exe has no console; the CLI's self-test shows the result in this window.
& dist\tramontane\tramontane-cli.exe self-test
if ($LASTEXITCODE -ne 0) { throw "the bundle's self-test failed" }
if ($NoInstaller) { exit 0 }

$Iscc = (Get-Command ISCC.exe -ErrorAction SilentlyContinue).Source
if (-not $Iscc) { $Iscc = Join-Path ${env:ProgramFiles(x86)} "Inno Setup 6\ISCC.exe" }
if (-not (Test-Path $Iscc)) { throw "Inno Setup 6 not found: install it (ISCC.exe) or put it on PATH" }
$Defines = @("/DAppVersion=$Version", "/DSourceDir=$Root\dist\tramontane")
if ($Split) { $Defines += "/DSplit" }
& $Iscc @Defines packaging\windows\tramontane.iss
if ($LASTEXITCODE -ne 0) { throw "ISCC failed" }
Write-Host "installer: dist\tramontane-$Version-windows-x64-setup.exe"
